// The generation engine: batched, KV-cached generation with continuous batching over a paged KV
// cache. Sequences join (prefill) whenever the cache has blocks for them, take another block as
// they grow, are preempted (and later prefilled again) when the blocks run out, and leave as soon
// as they finish; on CUDA every decode step replays a CUDA graph of the smallest planned batch
// size (powers of two up to max_num_seqs) that holds the running rows, captured the first time a
// step needs it.
//
// Threading: one caller at a time (the worker's actor role drives it).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/transformer.h"
#include "worker/parallel/communicator.h"
#include "worker/rollout/device_support.h"
#include "worker/rollout/fused_decoder.h"
#include "worker/rollout/paged_kv_cache.h"
#include "worker/rollout/request.h"

namespace rlhfd::rollout {

struct EngineOptions {
  int64_t max_num_seqs = 256;  // Sequences decoded together at most.
  // Longest prompt + response of a sequence; 0 = the model's max_position_embeddings, at most 4096.
  int64_t max_model_len = 0;
  // Positions per KV cache block, a multiple of 32.
  int64_t kv_block_size = 32;
  // The cache's block count instead of the one the memory budget gives (like vLLM's
  // num_gpu_blocks_override); 0: from the budget. At least one sequence of max_model_len.
  int64_t cache_blocks_override = 0;
  // Within a Generate call, whole blocks of written keys and values are kept under their tokens
  // and reused by sequences that start with the same tokens (vLLM's automatic prefix caching):
  // multi-turn samples going on, preempted ones coming back, prompts sharing a prefix.
  bool enable_prefix_caching = true;
  // KV cache budget on a GPU: this fraction of the memory free when the cache is allocated
  // (after the weights), like vLLM's gpu_memory_utilization. The rest stays for activations.
  double gpu_memory_utilization = 0.6;
  int64_t cpu_cache_bytes = int64_t{256} << 20;  // KV cache budget on the CPU.
  int64_t max_prefill_tokens = 16384;            // Padded prompt tokens per prefill forward.
  bool cuda_graphs = true;
  // Fault drills and tests only: each decode step waits this long first, so that a partial
  // rollout's interruption lands mid-generation.
  std::chrono::milliseconds decode_step_hold{0};
  std::vector<int64_t> eos_token_ids;  // Empty: the model's (config / generation_config).
  uint64_t seed = 0;                   // Seeds the seeds of requests that bring none.
};

struct EngineStats {
  int64_t cache_blocks = 0;  // Blocks sequences can hold (the scratch block not counted).
  int64_t cache_bytes = 0;
  int64_t peak_running = 0;  // The most sequences decoded together so far.
  int64_t peak_blocks = 0;   // The most cache blocks held at once so far.
  int64_t preemptions = 0;   // Sequences that gave their blocks up mid-run, to be prefilled again.
  int64_t prompts = 0;
  int64_t prefill_tokens = 0;  // Context tokens prefilled (computed; resumed contexts included).
  int64_t cached_prefix_tokens = 0;  // Context tokens found in the prefix cache, not prefilled.
  int64_t resumed_turns = 0;   // Samples that went on after a stop (TurnHandler).
  int64_t decode_steps = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t peak_memory_bytes = 0;  // GPU: the allocator's peak since the engine was created.
  std::vector<int64_t> graph_batch_sizes;  // The CUDA graphs captured so far, by batch size.
};

class GenerationEngine {
 public:
  // `model` is shared, not copied: the actor trains the same module between rollouts.
  static absl::StatusOr<std::unique_ptr<GenerationEngine>> Create(model::Transformer model,
                                                                  EngineOptions options);
  // Tensor-parallel generation on a GPU (the fused decode only): this rank's slices of `config`'s
  // model (TensorParallelSpecs of group.size()) on a CUDA device in bf16. Every rank of `group`
  // calls Generate with the same requests and gets the same results; the ranks agree on the
  // cache's block count, so they schedule alike. CUDA graphs where the group's collectives can be
  // captured (NCCL), not over sockets (workers sharing a GPU), whose collectives run on the host.
  static absl::StatusOr<std::unique_ptr<GenerationEngine>> CreateTensorParallel(
      const model::ModelConfig& config, std::map<std::string, at::Tensor> slices,
      parallel::Communicator& group, EngineOptions options);
  ~GenerationEngine();

  // Generates for every request; results in request order. Bad requests are refused before any
  // work with an error naming the request and the field to fix. With `turns`, a sample that
  // stops may go on (multi-turn): the handler's inserted tokens follow its stop token, and the
  // sample's whole context is prefilled again (it gives its blocks up while it waits) before it
  // samples the next token; max_new_tokens bounds the sampled and inserted tokens together.
  //
  // With `interrupt`, polled before each decode step: once it is above 0 the call stops, and every
  // sample not finished by then comes back with its tokens so far and FinishReason::kInterrupted
  // (a request with `resumed` goes on from them).
  absl::StatusOr<std::vector<GenerationResult>> Generate(
      const std::vector<GenerationRequest>& requests, TurnHandler* turns = nullptr,
      const std::atomic<int64_t>* interrupt = nullptr);

  // Frees the cache, the CUDA graphs, the fused weight copies and the workspaces; the next
  // Generate allocates them again. The GPU path reads the model's weights when it allocates, so
  // call Release() after changing them (the actor does, before training). A tensor-parallel
  // engine keeps its fused weights (its slices): make a new one for new weights.
  void Release();
  bool holds_memory() const { return cache_ != nullptr; }

  const EngineStats& stats() const { return stats_; }
  const EngineOptions& options() const { return options_; }

 private:
  struct Sequence;
  class Run;
  // `weight`: any of the weights, for their device and dtype.
  GenerationEngine(model::Transformer model, const model::ModelConfig& config,
                   const at::Tensor& weight, EngineOptions options);
  // Checks `options`, filling in what is left to the model (max_model_len).
  static absl::Status CompleteOptions(const model::ModelConfig& config, EngineOptions& options);
  // Tensor-parallel: the block count every rank of the group agrees on, the fewest any rank has;
  // `blocks` is this rank's.
  absl::StatusOr<int64_t> AgreeOnBlocks(int64_t blocks);

  absl::Status ValidateRequests(const std::vector<GenerationRequest>& requests) const;
  // The call's scheduling, over a prepared cache (engine_run.cc).
  std::vector<GenerationResult> Execute(const std::vector<GenerationRequest>& requests,
                                        TurnHandler* turns, const std::atomic<int64_t>* interrupt);
  absl::Status Prepare();  // Allocates the cache and plans the graphs.
  at::Tensor DecodeForward(int64_t rows);

  model::Transformer model_;  // Empty when tensor-parallel (fused_ holds the slices' weights).
  model::ModelConfig config_;
  parallel::Communicator* group_ = nullptr;
  EngineOptions options_;
  at::Device device_;
  at::ScalarType dtype_;
  std::mt19937_64 seed_sequence_;
  std::unique_ptr<PagedKvCache> cache_;
  std::unique_ptr<FusedDecoder> fused_;  // CUDA + bf16: the decode step; else the module forward.
  int64_t max_blocks_ = 0;               // Blocks of one sequence of max_model_len.
  DecodeGraphs graphs_;
  // Decode inputs, max_num_seqs rows; graphs read them here: (2, rows) token and position of each
  // row, and (rows, max_blocks_) each row's block table (the scratch block past its blocks).
  at::Tensor step_inputs_, block_tables_;
  // Per-step staging, allocated with the cache and reused (pinned on GPU hosts): the host side
  // of step_inputs_ and block_tables_, (2, rows, 3) two buffers of block-table entries (row,
  // index, block) for the steps that add blocks without rebuilding the inputs, with their device
  // twin (rows, 3), the sampling parameters (seed, counter, top_k / temperature, top_p per row)
  // with their device twins, and (2, rows) the drawn tokens with their log-probs of the two steps
  // that can be in flight.
  at::Tensor host_inputs_, host_tables_, host_table_updates_, device_table_updates_;
  at::Tensor host_ints_, host_floats_, device_ints_, device_floats_;
  at::Tensor host_tokens_, host_logprobs_;
  EngineStats stats_;
};

}  // namespace rlhfd::rollout
