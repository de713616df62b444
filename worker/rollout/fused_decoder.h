// The decode step on a CUDA GPU in bf16, fused: one GEMM for q/k/v, one for gate/up, and our
// kernels for residual + RMSNorm, rotary + cache append, attention and SiLU-gating, about nine
// kernels per layer where the module forward launches over forty. At decode batch sizes the step
// is bound by kernel count, not FLOPs.
//
// Holds rollout-layout copies of the q/k/v and gate/up weights (concatenated), made from the
// model's parameters when built; rebuild it after the weights change.
//
// Tensor-parallel (a group of tp ranks, each with its slices of TensorParallelSpecs): each rank
// runs its heads / tp query and key/value heads and F / tp MLP columns (its cache holds its
// key/value heads only); the row-parallel o and down projections are summed over the group in
// float32 (then rounded to bf16, as tp 1's GEMM rounds its float32 accumulation); the embedding
// and the head are vocabulary-parallel, the logits all-gathered, so every rank has the same
// logits and draws the same tokens. The collectives are queued on the stream (NCCL: no host wait
// inside a step, and a step can be captured into a CUDA graph); the caller waits for them with the
// group's Synchronize() before reading results. A failed collective throws (c10::Error) like a
// kernel's error.
#pragma once

#include <ATen/Tensor.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "worker/model/transformer.h"
#include "worker/parallel/communicator.h"
#include "worker/rollout/paged_kv_cache.h"

namespace rlhfd::rollout {

class FusedDecoder {
 public:
  // CUDA, bf16 weights, head dim 64 or 128, at most 16 query heads per key/value head.
  static bool Supports(const model::Transformer& model);
  // `config` is the whole model's, split `tp` ways; `weight` a parameter of the model or slice.
  static bool Supports(const model::ModelConfig& config, const at::Tensor& weight, int tp = 1);
  explicit FusedDecoder(model::Transformer& model);
  // This rank's slices (named as the model's parameters) of `group`'s tensor-parallel model.
  FusedDecoder(const model::ModelConfig& config, const std::map<std::string, at::Tensor>& slices,
               parallel::Communicator& group);

  // The shape of this rank's part: heads, key/value heads and the MLP width divided by tp (what
  // its KV cache is sized for).
  const model::ModelConfig& rank_config() const { return config_; }

  // tokens, positions (B) and block_tables (B, max_blocks) int64 on the device → next-token
  // logits (B, V) float32. Writes each row's key and value into its blocks of `cache`.
  at::Tensor Decode(const at::Tensor& tokens, const at::Tensor& positions,
                    const at::Tensor& block_tables, PagedKvCache& cache);
  // Prompts: ids (B, T) right-padded, lengths (B) and cache_rows (B, T) int64 on the device.
  // Writes token (b, t)'s key and value to cache row cache_rows[b][t] and returns the logits
  // after each row's last token (B, V) float32. Without `past` the rows are whole prompts (flash
  // attention); with it they follow cached prefixes, at past->positions, and attend them too.
  at::Tensor Prefill(const at::Tensor& ids, const at::Tensor& lengths, const at::Tensor& cache_rows,
                     const std::optional<PrefillPast>& past, PagedKvCache& cache);

 private:
  struct Layer {
    at::Tensor input_norm, post_norm, q_norm, k_norm;  // q_norm/k_norm: Qwen3 only.
    at::Tensor qkv_weight, qkv_bias;                   // (H + 2K) * D rows; bias optional.
    at::Tensor o_weight, o_bias;
    at::Tensor gate_up_weight, gate_up_bias;  // 2F rows.
    at::Tensor down_weight, down_bias;
  };
  // attend(layer, q (N, H, D), k (N, K, D) or undefined, qkv (N, (H + 2K) D)) → (N, H D).
  using AttendFn =
      std::function<at::Tensor(size_t, const at::Tensor&, const at::Tensor&, const at::Tensor&)>;
  // Embedding, every layer (keys and values into `cache`) and the final norm over N tokens; keeps
  // the rotated keys for `attend` when asked. Returns (N, C) bf16.
  // Token r's key and value go to cache row cache_rows[r].
  at::Tensor Layers(const at::Tensor& tokens, const at::Tensor& positions,
                    const at::Tensor& cache_rows, PagedKvCache& cache, bool keep_keys,
                    const AttendFn& attend);

  using Lookup = std::function<at::Tensor(const std::string&)>;
  FusedDecoder(const model::ModelConfig& config, const Lookup& get, const at::Tensor& head,
               parallel::Communicator* group);
  // Row-parallel projection: x (N, in / tp) by weight (out, in / tp) summed over the group in
  // float32, plus the bias, in bf16. Without a group, the plain projection.
  at::Tensor RowParallel(const at::Tensor& x, const at::Tensor& weight,
                         const at::Tensor& bias) const;
  at::Tensor Embed(const at::Tensor& tokens) const;
  // Logits (B, V) float32 of hidden states (B, C): this rank's vocabulary range, gathered.
  at::Tensor Logits(const at::Tensor& hidden) const;

  model::ModelConfig config_;                // This rank's part (rank_config()).
  parallel::Communicator* group_ = nullptr;  // Null: tp 1.
  int64_t vocab_begin_ = 0;                  // The first id of this rank's vocabulary range.
  at::Tensor embed_, final_norm_, head_, inv_freq_;
  std::vector<Layer> layers_;
};

}  // namespace rlhfd::rollout
