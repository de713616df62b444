#include "worker/rollout/engine.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <deque>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status/status_macros.h"
#include "worker/rollout/sampler.h"
#include "worker/rollout/sampling_math.h"

namespace rlhfd::rollout {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

at::TensorOptions HostOptions(const at::Device& device, at::ScalarType dtype) {
  // Pinned on GPU hosts, so per-step copies are asynchronous DMA.
  return at::TensorOptions().dtype(dtype).pinned_memory(device.is_cuda());
}

}  // namespace

// One sample in flight.
struct GenerationEngine::Sequence {
  size_t request = 0;
  int64_t sample = 0;
  int64_t slot = 0;
  int64_t prompt_length = 0;
  uint64_t seed = 0;
  Completion completion;
  bool finished = false;
};

// The state of one Generate call: the waiting queue, the running sequences and the free slots.
class GenerationEngine::Run {
 public:
  Run(GenerationEngine& engine, const std::vector<GenerationRequest>& requests)
      : engine_(engine), requests_(requests), results_(requests.size()) {
    for (int64_t slot = engine.usable_slots_ - 1; slot >= 0; --slot) free_slots_.push_back(slot);
    for (size_t i = 0; i < requests.size(); ++i) {
      waiting_.push_back(i);
      results_[i].samples.resize(requests[i].sampling.n);
      const auto& seed = requests[i].sampling.seed;
      seeds_.push_back(seed ? *seed : engine.seed_sequence_());
    }
    eos_ = engine.options_.eos_token_ids;
    if (eos_.empty()) eos_ = engine.model_->config().eos_token_ids;
  }

  std::vector<GenerationResult> Execute() {
    while (!waiting_.empty() || !running_.empty()) {
      if (!waiting_.empty()) Prefill();
      if (!running_.empty()) Decode();
    }
    return std::move(results_);
  }

 private:
  // Admits waiting requests while slots are free and the padded prompt tokens fit the prefill
  // budget (one request always fits), prefills them together and draws each sample's first token.
  void Prefill() {
    const auto start = std::chrono::steady_clock::now();
    std::vector<size_t> admitted;
    int64_t longest = 0, reserved = 0;
    while (!waiting_.empty()) {
      const GenerationRequest& request = requests_[waiting_.front()];
      const int64_t n = request.sampling.n;
      const int64_t length = static_cast<int64_t>(request.prompt_ids.size());
      const int64_t padded = std::max(longest, length) * static_cast<int64_t>(admitted.size() + 1);
      if (static_cast<int64_t>(free_slots_.size()) - reserved < n) break;
      if (!admitted.empty() && padded > engine_.options_.max_prefill_tokens) break;
      admitted.push_back(waiting_.front());
      waiting_.pop_front();
      longest = std::max(longest, length);
      reserved += n;
    }
    if (admitted.empty()) return;  // No free slots: the running sequences decode first.

    const int64_t batch = static_cast<int64_t>(admitted.size());
    at::Tensor ids = at::zeros({batch, longest}, at::kLong);
    at::Tensor mask = at::zeros({batch, longest}, at::kLong);
    at::Tensor last_index = at::empty({batch}, at::kLong);
    int64_t* id_data = ids.data_ptr<int64_t>();
    int64_t* mask_data = mask.data_ptr<int64_t>();
    std::vector<int64_t> first_slots, sample_rows, copy_from, copy_to;
    size_t first_sequence = running_.size();
    bool ragged = false;
    for (int64_t b = 0; b < batch; ++b) {
      const size_t r = admitted[b];
      const GenerationRequest& request = requests_[r];
      const int64_t length = static_cast<int64_t>(request.prompt_ids.size());
      ragged |= length != longest;
      std::copy(request.prompt_ids.begin(), request.prompt_ids.end(), id_data + b * longest);
      std::fill_n(mask_data + b * longest, length, 1);
      last_index.data_ptr<int64_t>()[b] = length - 1;
      for (int64_t j = 0; j < request.sampling.n; ++j) {
        Sequence sequence;
        sequence.request = r;
        sequence.sample = j;
        sequence.slot = free_slots_.back();
        free_slots_.pop_back();
        sequence.prompt_length = length;
        sequence.seed = SampleSeed(seeds_[r], static_cast<uint64_t>(j));
        if (j == 0) {
          first_slots.push_back(sequence.slot);
        } else {
          copy_from.push_back(first_slots.back());
          copy_to.push_back(sequence.slot);
        }
        sample_rows.push_back(b);
        running_.push_back(std::move(sequence));
      }
    }
    const at::Device device = engine_.device_;
    const auto on_device = [&](const std::vector<int64_t>& values) {
      return at::tensor(values, at::kLong).to(device);
    };
    SlotKvCache& cache = *engine_.cache_;
    cache.BeginPrefill(on_device(first_slots));
    model::ForwardBatch forward{ids.to(device), ragged ? mask.to(device) : at::Tensor()};
    at::Tensor hidden = engine_.model_->Hidden(forward, &cache);  // (B, T, C)
    at::Tensor last = hidden.index({at::arange(batch, hidden.options().dtype(at::kLong)),
                                    last_index.to(device)});      // (B, C)
    at::Tensor logits = engine_.model_->Logits(last.unsqueeze(1)).squeeze(1);  // (B, V)
    if (!copy_to.empty()) cache.CopyPrefix(on_device(copy_from), on_device(copy_to), longest);
    SampleAndAppend(logits.index_select(0, on_device(sample_rows)), first_sequence);

    engine_.stats_.prompts += batch;
    engine_.stats_.prefill_tokens += std::count(mask_data, mask_data + batch * longest, 1);
    engine_.stats_.prefill_seconds += Seconds(start);
  }

  // One decode step over every running sequence.
  void Decode() {
    const auto start = std::chrono::steady_clock::now();
    const int64_t rows = static_cast<int64_t>(running_.size());
    const int64_t bucket = engine_.graphs_.empty() ? rows : engine_.graphs_.BucketFor(rows);
    // Rows past `rows` (graph padding) decode a dummy token into the scratch slot.
    const int64_t scratch = engine_.usable_slots_;
    at::Tensor host = at::zeros({3, engine_.usable_slots_}, HostOptions(engine_.device_, at::kLong));
    host[2].fill_(scratch);
    int64_t* token = host[0].data_ptr<int64_t>();
    int64_t* position = host[1].data_ptr<int64_t>();
    int64_t* slot = host[2].data_ptr<int64_t>();
    for (int64_t i = 0; i < rows; ++i) {
      const Sequence& sequence = running_[i];
      const int64_t generated = static_cast<int64_t>(sequence.completion.token_ids.size());
      token[i] = sequence.completion.token_ids.back();
      position[i] = sequence.prompt_length + generated - 1;
      slot[i] = sequence.slot;
    }
    engine_.step_inputs_.copy_(host, /*non_blocking=*/true);
    const at::Tensor logits = engine_.graphs_.empty() ? engine_.DecodeForward(bucket)
                                                      : engine_.graphs_.Replay(bucket);
    SampleAndAppend(logits.narrow(0, 0, rows), 0);
    engine_.stats_.decode_steps += 1;
    engine_.stats_.decode_seconds += Seconds(start);
  }

  // Draws the next token of running_[first..] from logits (one row each), appends it, and retires
  // the sequences that finished.
  void SampleAndAppend(const at::Tensor& logits, size_t first) {
    const int64_t rows = logits.size(0);
    at::Tensor ints = at::empty({3, rows}, HostOptions(engine_.device_, at::kLong));
    at::Tensor floats = at::empty({2, rows}, HostOptions(engine_.device_, at::kFloat));
    int64_t* seed = ints.data_ptr<int64_t>();
    int64_t* counter = seed + rows;
    int64_t* top_k = counter + rows;
    float* temperature = floats.data_ptr<float>();
    float* top_p = temperature + rows;
    bool filtered = false;
    for (int64_t i = 0; i < rows; ++i) {
      const Sequence& sequence = running_[first + i];
      const SamplingParams& sampling = requests_[sequence.request].sampling;
      seed[i] = static_cast<int64_t>(sequence.seed);
      counter[i] = static_cast<int64_t>(sequence.completion.token_ids.size());
      top_k[i] = sampling.top_k;
      temperature[i] = static_cast<float>(sampling.temperature);
      top_p[i] = static_cast<float>(sampling.top_p);
      filtered |= sampling.top_k > 0 || sampling.top_p < 1.0;
    }
    const at::Tensor device_ints = ints.to(engine_.device_, /*non_blocking=*/true);
    const at::Tensor device_floats = floats.to(engine_.device_, /*non_blocking=*/true);
    SamplingRows parameters{device_floats[0], device_ints[0], device_ints[1]};
    if (filtered) {
      parameters.top_k = device_ints[2];
      parameters.top_p = device_floats[1];
    }
    const SampledTokens drawn = SampleTokens(logits, parameters);
    const at::Tensor tokens = drawn.tokens.to(at::kCPU);
    const at::Tensor logprobs = drawn.logprobs.to(at::kCPU);
    const int64_t* token = tokens.data_ptr<int64_t>();
    const float* logprob = logprobs.data_ptr<float>();
    for (int64_t i = 0; i < rows; ++i) {
      Sequence& sequence = running_[first + i];
      const SamplingParams& sampling = requests_[sequence.request].sampling;
      sequence.completion.token_ids.push_back(token[i]);
      sequence.completion.logprobs.push_back(logprob[i]);
      const bool eos = !sampling.ignore_eos && std::count(eos_.begin(), eos_.end(), token[i]);
      const bool stop = std::count(sampling.stop_token_ids.begin(),
                                   sampling.stop_token_ids.end(), token[i]) > 0;
      if (eos || stop) {
        sequence.completion.finish_reason = FinishReason::kStop;
        sequence.finished = true;
      } else if (static_cast<int64_t>(sequence.completion.token_ids.size()) >=
                 sampling.max_new_tokens) {
        sequence.completion.finish_reason = FinishReason::kLength;
        sequence.finished = true;
      }
    }
    engine_.stats_.generated_tokens += rows;
    // Retire finished sequences: their slots free up for the next admission.
    std::vector<Sequence> still_running;
    still_running.reserve(running_.size());
    for (Sequence& sequence : running_) {
      if (!sequence.finished) {
        still_running.push_back(std::move(sequence));
        continue;
      }
      free_slots_.push_back(sequence.slot);
      results_[sequence.request].samples[sequence.sample] = std::move(sequence.completion);
    }
    running_ = std::move(still_running);
  }

  GenerationEngine& engine_;
  const std::vector<GenerationRequest>& requests_;
  std::vector<GenerationResult> results_;
  std::vector<uint64_t> seeds_;
  std::vector<int64_t> eos_;
  std::deque<size_t> waiting_;
  std::vector<Sequence> running_;
  std::vector<int64_t> free_slots_;
};

GenerationEngine::GenerationEngine(model::Transformer model, EngineOptions options)
    : model_(std::move(model)),
      options_(std::move(options)),
      device_(model_->HeadWeight().device()),
      dtype_(model_->HeadWeight().scalar_type()),
      seed_sequence_(options_.seed),
      graphs_(device_) {}

GenerationEngine::~GenerationEngine() = default;

absl::StatusOr<std::unique_ptr<GenerationEngine>> GenerationEngine::Create(
    model::Transformer model, EngineOptions options) {
  if (model->config().head != model::HeadKind::kCausalLm) {
    return absl::InvalidArgumentError("generation needs a causal-LM model (this one has a score head)");
  }
  if (options.max_num_seqs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_num_seqs must be at least 1, got ", options.max_num_seqs));
  }
  if (!(options.gpu_memory_utilization > 0 && options.gpu_memory_utilization < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gpu_memory_utilization must be in (0, 1), got ", options.gpu_memory_utilization));
  }
  if (options.max_prefill_tokens < 1) {
    return absl::InvalidArgumentError("max_prefill_tokens must be at least 1");
  }
  const int64_t model_limit = model->config().max_position_embeddings;
  if (options.max_model_len == 0) options.max_model_len = std::min<int64_t>(model_limit, 4096);
  if (options.max_model_len < 2 || options.max_model_len > model_limit) {
    return absl::InvalidArgumentError(absl::StrCat("max_model_len must be in [2, ", model_limit,
                                                   "] (max_position_embeddings), got ",
                                                   options.max_model_len));
  }
  auto engine = std::unique_ptr<GenerationEngine>(
      new GenerationEngine(std::move(model), std::move(options)));
  ResetPeakMemory(engine->device_);
  return engine;
}

absl::Status GenerationEngine::ValidateRequests(
    const std::vector<GenerationRequest>& requests) const {
  const int64_t vocab = model_->config().vocab_size;
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationRequest& request = requests[i];
    const SamplingParams& sampling = request.sampling;
    const std::string where = absl::StrCat("request ", i, ": ");
    const int64_t length = static_cast<int64_t>(request.prompt_ids.size());
    if (length == 0) return absl::InvalidArgumentError(where + "empty prompt");
    for (int64_t id : request.prompt_ids) {
      if (id < 0 || id >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "prompt token id ", id, " outside the vocabulary [0, ", vocab, ")"));
      }
    }
    if (sampling.max_new_tokens < 1) {
      return absl::InvalidArgumentError(where + "max_new_tokens must be at least 1");
    }
    if (length + sampling.max_new_tokens > options_.max_model_len) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "prompt (", length, " tokens) + max_new_tokens (", sampling.max_new_tokens,
          ") exceeds max_model_len ", options_.max_model_len,
          "; shorten the prompt, lower max_new_tokens or raise max_model_len"));
    }
    if (!(sampling.temperature >= 0)) {
      return absl::InvalidArgumentError(where + "temperature must be >= 0 (0 = greedy)");
    }
    if (sampling.top_k < 0) return absl::InvalidArgumentError(where + "top_k must be >= 0 (0 = off)");
    if (!(sampling.top_p > 0 && sampling.top_p <= 1)) {
      return absl::InvalidArgumentError(where + "top_p must be in (0, 1]");
    }
    if (sampling.n < 1) return absl::InvalidArgumentError(where + "n must be at least 1");
    if (cache_ != nullptr && sampling.n > usable_slots_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          where, "n = ", sampling.n, " samples need as many cache slots; the cache has ",
          usable_slots_, " (raise gpu_memory_utilization or lower max_model_len)"));
    }
  }
  return absl::OkStatus();
}

absl::Status GenerationEngine::Prepare() {
  if (cache_ != nullptr) return absl::OkStatus();
  const model::ModelConfig& config = model_->config();
  const int64_t per_slot = SlotKvCache::BytesPerSlot(config, options_.max_model_len, dtype_);
  int64_t budget = options_.cpu_cache_bytes;
  if (device_.is_cuda()) {
    budget = static_cast<int64_t>(options_.gpu_memory_utilization *
                                  static_cast<double>(QueryDeviceMemory(device_).free_bytes));
  }
  // One slot more than the sequences: graph padding rows write into it.
  const int64_t slots = std::min(options_.max_num_seqs, budget / per_slot - 1);
  if (slots < 1) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache budget of ", budget >> 20, " MiB holds fewer than 2 slots of ",
        options_.max_model_len, " tokens (", per_slot >> 20,
        " MiB each); raise gpu_memory_utilization / cpu_cache_bytes or lower max_model_len"));
  }
  try {
    cache_ = std::make_unique<SlotKvCache>(config, slots + 1, options_.max_model_len,
                                           at::TensorOptions().dtype(dtype_).device(device_));
    usable_slots_ = slots;
    step_inputs_ = at::zeros({3, slots}, at::TensorOptions().dtype(at::kLong).device(device_));
    step_inputs_[2].fill_(slots);
    if (FusedDecoder::Supports(model_)) fused_ = std::make_unique<FusedDecoder>(model_);
    stats_.cache_slots = slots;
    stats_.cache_bytes = per_slot * (slots + 1);
    stats_.graph_batch_sizes.clear();
    if (options_.cuda_graphs && DecodeGraphs::Available(device_)) {
      std::vector<int64_t> sizes;
      for (int64_t b = 1; b < slots; b *= 2) sizes.push_back(b);
      sizes.push_back(slots);
      std::reverse(sizes.begin(), sizes.end());  // Largest first: the rest reuse its memory.
      for (int64_t b : sizes) {
        RETURN_IF_ERROR(graphs_.Capture(b, [this, b] { return DecodeForward(b); }));
        stats_.graph_batch_sizes.push_back(b);
      }
    }
  } catch (const c10::Error& error) {
    Release();
    return absl::ResourceExhaustedError(
        absl::StrCat("allocating the KV cache: ", error.what_without_backtrace()));
  }
  return absl::OkStatus();
}

at::Tensor GenerationEngine::DecodeForward(int64_t rows) {
  const at::Tensor tokens = step_inputs_[0].narrow(0, 0, rows);
  const at::Tensor positions = step_inputs_[1].narrow(0, 0, rows);
  const at::Tensor slots = step_inputs_[2].narrow(0, 0, rows);
  if (fused_) return fused_->Forward(tokens, positions, slots, *cache_);
  cache_->BeginDecode(slots, positions);
  model::ForwardBatch batch{tokens.view({rows, 1}), at::Tensor(), positions.view({rows, 1})};
  const at::Tensor hidden = model_->Hidden(batch, cache_.get());
  return model_->Logits(hidden).view({rows, -1});
}

absl::StatusOr<std::vector<GenerationResult>> GenerationEngine::Generate(
    const std::vector<GenerationRequest>& requests) {
  RETURN_IF_ERROR(ValidateRequests(requests));
  c10::InferenceMode inference;
  RETURN_IF_ERROR(Prepare());
  RETURN_IF_ERROR(ValidateRequests(requests));  // Now against the cache's slot count too.
  try {
    Run run(*this, requests);
    std::vector<GenerationResult> results = run.Execute();
    stats_.peak_memory_bytes = QueryDeviceMemory(device_).peak_allocated_bytes;
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
  fused_.reset();
  cache_.reset();
  step_inputs_ = at::Tensor();
  usable_slots_ = 0;
  Synchronize(device_);
  ReleaseCachedMemory(device_);
}

}  // namespace rlhfd::rollout
