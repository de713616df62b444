#include "worker/rollout/engine.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "worker/device/device_memory.h"
#include "worker/parallel/tensor_parallel.h"
#include "worker/rollout/request_check.h"

namespace rlhfd::rollout {
namespace {

at::TensorOptions HostOptions(const at::Device& device, at::ScalarType dtype) {
  // Pinned on GPU hosts, so per-step copies are asynchronous DMA.
  return at::TensorOptions().dtype(dtype).pinned_memory(device.is_cuda());
}

}  // namespace

GenerationEngine::GenerationEngine(model::Transformer model, const model::ModelConfig& config,
                                   const at::Tensor& weight, EngineOptions options)
    : model_(std::move(model)),
      config_(config),
      options_(std::move(options)),
      device_(weight.device()),
      dtype_(weight.scalar_type()),
      seed_sequence_(options_.seed),
      graphs_(device_) {}

GenerationEngine::~GenerationEngine() = default;

absl::StatusOr<std::unique_ptr<GenerationEngine>> GenerationEngine::Create(model::Transformer model,
                                                                           EngineOptions options) {
  RETURN_IF_ERROR(CompleteOptions(model->config(), options));
  const model::ModelConfig config = model->config();
  const at::Tensor head = model->HeadWeight();
  auto engine = std::unique_ptr<GenerationEngine>(
      new GenerationEngine(std::move(model), config, head, std::move(options)));
  worker::ResetPeakMemory(engine->device_);
  return engine;
}

absl::StatusOr<std::unique_ptr<GenerationEngine>> GenerationEngine::CreateTensorParallel(
    const model::ModelConfig& config, std::map<std::string, at::Tensor> slices,
    parallel::Communicator& group, EngineOptions options) {
  RETURN_IF_ERROR(CompleteOptions(config, options));
  RETURN_IF_ERROR(parallel::CheckTensorParallelSlices(config, slices, group.size()));
  const at::Tensor embed = slices.at("model.embed_tokens.weight");  // Checked just above.
  if (!FusedDecoder::Supports(config, embed, group.size())) {
    return absl::FailedPreconditionError(
        "tensor-parallel generation runs the fused GPU decode: bf16 weights on a CUDA device, "
        "head_dim 64 or 128, a hidden size that is a multiple of 4 up to 16384, an even MLP "
        "width per rank, at most 16 query heads per key/value head");
  }
  auto engine = std::unique_ptr<GenerationEngine>(
      new GenerationEngine(model::Transformer(nullptr), config, embed, std::move(options)));
  engine->group_ = &group;
  // Over sockets the collectives run on the host, between the kernels: no graph can hold them.
  engine->options_.cuda_graphs = engine->options_.cuda_graphs && group.CapturableInGraphs();
  try {
    // Built once, for the engine's life (its weights are the slices, which it does not keep: the
    // decoder's concatenated copies replace the q/k/v and gate/up slices).
    engine->fused_ = std::make_unique<FusedDecoder>(config, slices, group);
  } catch (const c10::Error& error) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the fused decode's weights: ", error.what_without_backtrace()));
  }
  worker::ResetPeakMemory(engine->device_);
  return engine;
}

absl::Status GenerationEngine::CompleteOptions(const model::ModelConfig& config,
                                               EngineOptions& options) {
  if (config.head != model::HeadKind::kCausalLm) {
    return absl::InvalidArgumentError(
        "generation needs a causal-LM model (this one has a score head)");
  }
  if (options.max_num_seqs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_num_seqs must be at least 1, got ", options.max_num_seqs));
  }
  if (!(options.gpu_memory_utilization > 0 && options.gpu_memory_utilization < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("gpu_memory_utilization must be in (0, 1), got ",
                                                   options.gpu_memory_utilization));
  }
  if (options.max_prefill_tokens < 1) {
    return absl::InvalidArgumentError("max_prefill_tokens must be at least 1");
  }
  if (options.kv_block_size < 32 || options.kv_block_size % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_block_size must be a positive multiple of 32, got ", options.kv_block_size));
  }
  if (options.cache_blocks_override < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache_blocks_override must be 0 (from the memory budget) or more, got ",
                     options.cache_blocks_override));
  }
  const int64_t model_limit = config.max_position_embeddings;
  if (options.max_model_len == 0) options.max_model_len = std::min<int64_t>(model_limit, 4096);
  if (options.max_model_len < 2 || options.max_model_len > model_limit) {
    return absl::InvalidArgumentError(absl::StrCat("max_model_len must be in [2, ", model_limit,
                                                   "] (max_position_embeddings), got ",
                                                   options.max_model_len));
  }
  return absl::OkStatus();
}

absl::Status GenerationEngine::ValidateRequests(
    const std::vector<GenerationRequest>& requests) const {
  for (size_t i = 0; i < requests.size(); ++i) {
    RETURN_IF_ERROR(
        CheckGenerationRequest(requests[i], i, config_.vocab_size, options_.max_model_len));
    const int64_t n = requests[i].sampling.n;
    if (n > options_.max_num_seqs) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", i, ": n = ", n, " samples are decoded together, more than max_num_seqs = ",
          options_.max_num_seqs, " (raise max_num_seqs or lower n)"));
    }
    if (cache_ == nullptr) continue;
    // Admission takes the prompt's blocks for the first sample and a copy of a partly filled
    // last block for each other one (engine_run.cc); they must fit the cache at once.
    const int64_t block_size = cache_->block_size();
    const int64_t context =
        static_cast<int64_t>(requests[i].prompt_ids.size() +
                             (requests[i].resumed ? requests[i].resumed->token_ids.size() : 0));
    const int64_t blocks =
        (context + block_size - 1) / block_size + (n - 1) * (context % block_size != 0 ? 1 : 0);
    if (blocks > stats_.cache_blocks) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "request ", i, ": its ", n, " samples' prompts take ", blocks, " KV cache blocks of ",
          block_size, " positions at once; the cache has ", stats_.cache_blocks,
          " (raise gpu_memory_utilization / cpu_cache_bytes or lower n)"));
    }
  }
  return absl::OkStatus();
}

absl::Status GenerationEngine::Prepare() {
  if (cache_ != nullptr) return absl::OkStatus();
  if (group_ == nullptr && FusedDecoder::Supports(model_)) {
    try {
      fused_ = std::make_unique<FusedDecoder>(model_);
    } catch (const c10::Error& error) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the fused decode's weights: ", error.what_without_backtrace()));
    }
  }
  // A tensor-parallel rank caches its own key/value heads only.
  const model::ModelConfig& config = fused_ ? fused_->rank_config() : config_;
  const int64_t block_size = options_.kv_block_size, rows = options_.max_num_seqs;
  const int64_t per_block = PagedKvCache::BytesPerBlock(config, block_size, dtype_);
  max_blocks_ = (options_.max_model_len + block_size - 1) / block_size;
  int64_t budget = options_.cpu_cache_bytes;
  if (device_.is_cuda()) {
    budget =
        static_cast<int64_t>(options_.gpu_memory_utilization *
                             static_cast<double>(worker::QueryDeviceMemory(device_).free_bytes));
  }
  // Ranks sharing a device (workers on one GPU) each saw the same free memory: each takes its
  // share of the budget, not all of it.
  int64_t sharing = 1;
  if (group_ != nullptr) {
    ASSIGN_OR_RETURN(sharing, RanksOnThisDevice(*group_, device_));
  }
  // Never more than every row at max_model_len needs; one block more is scratch.
  int64_t blocks = options_.cache_blocks_override > 0
                       ? options_.cache_blocks_override
                       : std::min(budget / sharing / per_block - 1, rows * max_blocks_);
  if (group_ != nullptr) {
    ASSIGN_OR_RETURN(blocks, AgreeOnBlocks(blocks));
  }
  if (blocks < max_blocks_) {
    if (group_ == nullptr) fused_.reset();
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache budget of ", budget >> 20, " MiB holds ",
                     std::max<int64_t>(blocks, 0), " blocks of ", block_size, " positions (",
                     per_block >> 10, " KiB each), fewer than one sequence of max_model_len ",
                     options_.max_model_len, " needs (", max_blocks_,
                     "); raise gpu_memory_utilization / cpu_cache_bytes or lower "
                     "max_model_len"));
  }
  absl::Status allocated;
  try {
    cache_ = std::make_unique<PagedKvCache>(config, blocks + 1, block_size,
                                            at::TensorOptions().dtype(dtype_).device(device_));
    const auto on_device = at::TensorOptions().device(device_).dtype(at::kLong);
    step_inputs_ = at::zeros({2, rows}, on_device);
    block_tables_ = at::full({rows, max_blocks_}, cache_->scratch_block(), on_device);
    host_inputs_ = at::zeros({2, rows}, HostOptions(device_, at::kLong));
    host_tables_ = at::zeros({rows, max_blocks_}, HostOptions(device_, at::kLong));
    host_table_updates_ = at::zeros({2, rows, 3}, HostOptions(device_, at::kLong));
    device_table_updates_ = at::zeros({rows, 3}, on_device);
    host_ints_ = at::zeros({3, rows}, HostOptions(device_, at::kLong));
    host_floats_ = at::zeros({2, rows}, HostOptions(device_, at::kFloat));
    device_ints_ = at::zeros({3, rows}, on_device);
    device_floats_ = at::zeros({2, rows}, on_device.dtype(at::kFloat));
    host_tokens_ = at::zeros({2, rows}, HostOptions(device_, at::kLong));
    host_logprobs_ = at::zeros({2, rows}, HostOptions(device_, at::kFloat));
    stats_.cache_blocks = blocks;
    stats_.cache_bytes = per_block * (blocks + 1);
  } catch (const c10::Error& error) {
    allocated = absl::ResourceExhaustedError(
        absl::StrCat("allocating the KV cache: ", error.what_without_backtrace()));
  }
  if (group_ != nullptr) {
    // The prefill and the decode steps (and the graphs' captures, on first use) run the group's
    // collectives: every rank goes on only if every rank has its cache (else the others would
    // wait in them for one that left).
    const at::Tensor ready =
        at::full({1}, allocated.ok() ? 1 : 0, at::TensorOptions(at::kLong).device(device_));
    absl::Status agreed = group_->AllReduce(ready, parallel::ReduceOp::kMin);
    if (agreed.ok() && ready.item<int64_t>() == 0) {
      agreed = absl::ResourceExhaustedError(
          "a rank of the tensor-parallel group could not allocate its KV cache (its log says why)");
    }
    if (allocated.ok()) allocated = agreed;
  }
  if (!allocated.ok()) {
    Release();
    return allocated;
  }
  if (options_.cuda_graphs && DecodeGraphs::Available(device_)) {
    // Captured as the steps need them (DecodeGraphs::Replay).
    std::vector<int64_t> sizes;
    for (int64_t b = 1; b < rows; b *= 2) sizes.push_back(b);
    sizes.push_back(rows);
    graphs_.Plan(std::move(sizes));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> GenerationEngine::AgreeOnBlocks(int64_t blocks) {
  // The ranks schedule alike only over the same blocks: the fewest any rank's memory allows (a
  // rank that cannot hold one sequence makes every rank give up together).
  const at::Tensor fewest = at::full({1}, blocks, at::TensorOptions(at::kLong).device(device_));
  RETURN_IF_ERROR(group_->AllReduce(fewest, parallel::ReduceOp::kMin));
  const int64_t agreed = fewest.item<int64_t>();
  if (agreed < max_blocks_ && blocks >= max_blocks_) {
    return absl::ResourceExhaustedError(
        "a rank of the tensor-parallel group has no memory for its KV cache (its log says why)");
  }
  return agreed;
}

at::Tensor GenerationEngine::DecodeForward(int64_t rows) {
  const at::Tensor tokens = step_inputs_[0].narrow(0, 0, rows);
  const at::Tensor positions = step_inputs_[1].narrow(0, 0, rows);
  const at::Tensor tables = block_tables_.narrow(0, 0, rows);
  if (fused_) return fused_->Decode(tokens, positions, tables, *cache_);
  cache_->BeginDecode(tables, positions);
  model::ForwardBatch batch{tokens.view({rows, 1}), at::Tensor(), positions.view({rows, 1})};
  const at::Tensor hidden = model_->Hidden(batch, cache_.get());
  return model_->Logits(hidden).view({rows, -1});
}

absl::StatusOr<std::vector<GenerationResult>> GenerationEngine::Generate(
    const std::vector<GenerationRequest>& requests, TurnHandler* turns,
    const std::atomic<int64_t>* interrupt) {
  RETURN_IF_ERROR(ValidateRequests(requests));
  c10::InferenceMode inference;
  RETURN_IF_ERROR(Prepare());
  RETURN_IF_ERROR(ValidateRequests(requests));  // Now against the cache's block count too.
  try {
    std::vector<GenerationResult> results = Execute(requests, turns, interrupt);
    stats_.graph_batch_sizes = graphs_.CapturedSizes();
    stats_.peak_memory_bytes = worker::QueryDeviceMemory(device_).peak_allocated_bytes;
    return results;
  } catch (const c10::OutOfMemoryError& error) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "out of device memory while generating (lower max_num_seqs, max_prefill_tokens or "
        "gpu_memory_utilization): ",
        error.what_without_backtrace()));
  } catch (const c10::Error& error) {
    return absl::InternalError(absl::StrCat("generation failed: ", error.what_without_backtrace()));
  }
}

void GenerationEngine::Release() {
  graphs_.Clear();
  stats_.graph_batch_sizes.clear();
  if (group_ == nullptr) fused_.reset();  // A tensor-parallel engine's decoder holds its weights.
  cache_.reset();
  for (at::Tensor* buffer :
       {&step_inputs_, &block_tables_, &host_inputs_, &host_tables_, &host_table_updates_,
        &device_table_updates_, &host_ints_, &host_floats_, &device_ints_, &device_floats_,
        &host_tokens_, &host_logprobs_}) {
    *buffer = at::Tensor();
  }
  Synchronize(device_);
  worker::ReleaseCachedMemory(device_);
}

}  // namespace rlhfd::rollout
