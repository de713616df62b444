#include "worker/roles/actor_role.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/algorithms/on_policy.h"
#include "common/logging/logging.h"
#include "common/status/status_macros.h"
#include "worker/model/model_loader.h"
#include "worker/parallel/fully_sharded.h"
#include "worker/parallel/tensor_parallel.h"
#include "worker/roles/forward_passes.h"
#include "worker/roles/prompt_encoding.h"
#include "worker/roles/training_setup.h"
#include "worker/rollout/device_support.h"
#include "worker/rollout/tensor_parallel_generation.h"
#include "worker/train/flops_estimate.h"
#include "worker/train/policy_update.h"

namespace rlhfd::roles {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Each prompt's sampling seed, from the step's seed and the prompt's place in the batch: the same
// whichever rank generates it.
uint64_t PromptSeed(uint64_t step_seed, int64_t prompt) {
  uint64_t x = step_seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(prompt + 1);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

int64_t ResponseBudget(const v1::JobSpec& spec) {
  const int32_t configured = spec.roles().actor().rollout().max_new_tokens();
  return configured > 0 ? configured : spec.data().max_response_length();
}

rollout::SamplingParams TrainingSampling(const v1::JobSpec& spec) {
  const v1::RolloutSpec& rollout = spec.roles().actor().rollout();
  rollout::SamplingParams sampling;
  sampling.temperature = rollout.temperature();
  sampling.top_k = std::max(0, rollout.top_k());
  sampling.top_p = rollout.top_p();
  sampling.max_new_tokens = ResponseBudget(spec);
  sampling.stop_token_ids.assign(rollout.stop_token_ids().begin(), rollout.stop_token_ids().end());
  sampling.n = rollout.n();
  return sampling;
}

rollout::SamplingParams ValidationSampling(const v1::JobSpec& spec) {
  const v1::ValidationSampling& val = spec.roles().actor().rollout().val_kwargs();
  rollout::SamplingParams sampling = TrainingSampling(spec);
  sampling.n = std::max(1, val.n());
  sampling.temperature = val.do_sample() ? val.temperature() : 0.0;
  sampling.top_k = std::max(0, val.top_k());
  sampling.top_p = val.top_p() > 0 ? val.top_p() : 1.0;
  return sampling;
}

}  // namespace

ActorRole::ActorRole(const v1::JobSpec& spec, const at::Device& device,
                     parallel::Communicator& pool, model::Tokenizer tokenizer)
    : spec_(spec), device_(device), pool_(pool), tokenizer_(std::move(tokenizer)) {}

absl::StatusOr<std::unique_ptr<ActorRole>> ActorRole::Create(const v1::JobSpec& spec,
                                                             const at::Device& device,
                                                             parallel::Communicator& pool,
                                                             int64_t rl_steps) {
  const v1::ModelSpec& model_spec = spec.model();
  const std::string tokenizer_dir =
      model_spec.tokenizer_path().empty() ? model_spec.path() : model_spec.tokenizer_path();
  ASSIGN_OR_RETURN(model::Tokenizer tokenizer, model::Tokenizer::Load(tokenizer_dir));
  if (model_spec.chat_template() != "auto" && !model_spec.chat_template().empty()) {
    ASSIGN_OR_RETURN(model::ChatTemplate chat,
                     model::ChooseChatTemplate(model_spec.chat_template(), ""));
    tokenizer.set_chat_template(chat);
  }
  model::LoadOptions load;
  load.dtype = WeightDtype(spec, device, /*trains=*/true);
  load.device = device;
  load.head = model::HeadNeed::kCausalLm;
  load.max_sequence_length = spec.data().max_prompt_length() + ResponseBudget(spec);
  load.sequence_what = "data.max_prompt_length + the response budget";
  ASSIGN_OR_RETURN(model::Transformer module, model::LoadModel(model_spec.path(), load));
  RETURN_IF_ERROR(
      model::CheckTokenizerFitsModel(tokenizer, module->config().vocab_size, model_spec.path()));
  module->train();
  auto role = std::unique_ptr<ActorRole>(new ActorRole(spec, device, pool, std::move(tokenizer)));
  const v1::TrainSpec& train = spec.roles().actor().train();
  const int tp = spec.roles().actor().rollout().tp();
  if (tp > 1) {
    // Rollout rank k * tp + j is slice j of tensor-parallel group k (reshard.h's numbering).
    if (device.is_cuda() || pool.size() % tp != 0) {
      return absl::FailedPreconditionError(absl::StrCat("roles.actor.rollout.tp ", tp,
                                                        " runs on CPU workers whose actor pool (",
                                                        pool.size(), " ranks) it divides"));
    }
    ASSIGN_OR_RETURN(role->tp_group_, pool.Split(pool.rank() / tp, pool.rank() % tp));
    RLOG(INFO) << "actor rank " << pool.rank() << ": rollout as slice " << pool.rank() % tp
               << " of tensor-parallel group " << pool.rank() / tp << " (tp " << tp << ")";
  }
  role->trained_ = MakeTrainedModel(std::move(module), train, pool);
  role->schedule_.emplace(train,
                          std::max<int64_t>(1, rl_steps * OptimizerStepsPerRlStep(spec, train)));
  return role;
}

absl::StatusOr<model::Transformer> ActorRole::WeightsIn(at::ScalarType dtype) {
  model::Transformer& trained = trained_->module();
  auto* sharded = dynamic_cast<parallel::FullyShardedModel*>(trained_.get());
  if (sharded == nullptr && dtype == at::kFloat) return trained;
  // The layout shards the weights, or they are wanted in a narrower dtype: a copy.
  std::vector<at::Tensor> full;
  if (sharded != nullptr) {
    ASSIGN_OR_RETURN(full, sharded->FullParameters());
  } else {
    full = trained->parameters();
  }
  try {
    at::NoGradGuard no_grad;
    if (!copy_ || copy_dtype_ != dtype) {
      // The module is built once (on the CPU, where its constructor initialises it); later
      // copies only allocate its storage again (ReleaseCopy frees it).
      model::Transformer copy(trained->config());
      copy->to(device_, dtype);
      model::KeepNormWeightsWide(copy);
      copy->eval();
      copy_ = copy;
      copy_dtype_ = dtype;
      copy_shapes_.clear();
      for (const at::Tensor& p : copy->parameters()) {
        copy_shapes_.emplace_back(p.sizes().vec(), p.scalar_type());
      }
    }
    std::vector<at::Tensor> params = (*copy_)->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].numel() == 0 && !copy_shapes_[i].first.empty()) {
        params[i].set_data(
            at::empty(copy_shapes_[i].first,
                      at::TensorOptions().dtype(copy_shapes_[i].second).device(device_)));
      }
      params[i].copy_(full[i]);
    }
    copy_held_ = true;
    return *copy_;
  } catch (const std::exception& error) {
    ReleaseCopy();
    return absl::ResourceExhaustedError(absl::StrCat("a copy of the actor's weights does not fit: ",
                                                     std::string(error.what()).substr(0, 300)));
  }
}

void ActorRole::ReleaseCopy() {
  if (!copy_ || !copy_held_) return;
  at::NoGradGuard no_grad;
  for (at::Tensor& p : (*copy_)->parameters()) {
    p.set_data(at::empty({0}, p.options()));
  }
  copy_held_ = false;
}

absl::StatusOr<model::Transformer> ActorRole::FullWeights() { return WeightsIn(at::kFloat); }

absl::StatusOr<rollout::GenerationEngine*> ActorRole::Engine() {
  // The engine reads the weights when it allocates its cache (after Release), so the copy is
  // refreshed first; the engine itself (over the same module) lives from step to step.
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(model::Transformer rollout_model,
                   WeightsIn(WeightDtype(spec_, device_, /*trains=*/false)));
  rollout::Synchronize(device_);
  weights_update_s_ = Seconds(start);
  if (engine_) return engine_.get();
  const v1::RolloutSpec& rollout = spec_.roles().actor().rollout();
  rollout::EngineOptions options;
  options.max_num_seqs = rollout.max_num_seqs();
  options.max_model_len = spec_.data().max_prompt_length() + ResponseBudget(spec_);
  options.gpu_memory_utilization = rollout.gpu_memory_utilization();
  options.seed = static_cast<uint64_t>(spec_.trainer().seed());
  ASSIGN_OR_RETURN(engine_, rollout::GenerationEngine::Create(rollout_model, options));
  return engine_.get();
}

void ActorRole::ReleaseRollout() {
  if (engine_) engine_->Release();
  tensor_parallel_.reset();
  ReleaseCopy();
}

namespace {

// A rank's requests as int64 words (doubles bit for bit), for gathering over a group.
void AppendRequests(const std::vector<rollout::GenerationRequest>& requests,
                    std::vector<int64_t>& words) {
  words.push_back(static_cast<int64_t>(requests.size()));
  for (const rollout::GenerationRequest& request : requests) {
    const rollout::SamplingParams& s = request.sampling;
    words.insert(words.end(),
                 {static_cast<int64_t>(s.seed.value_or(0)), std::bit_cast<int64_t>(s.temperature),
                  s.top_k, std::bit_cast<int64_t>(s.top_p), s.max_new_tokens, s.n,
                  s.ignore_eos ? 1 : 0, static_cast<int64_t>(s.stop_token_ids.size()),
                  static_cast<int64_t>(request.prompt_ids.size())});
    words.insert(words.end(), s.stop_token_ids.begin(), s.stop_token_ids.end());
    words.insert(words.end(), request.prompt_ids.begin(), request.prompt_ids.end());
  }
}

// The inverse of AppendRequests: appends one rank's requests to `requests`.
void ReadRequests(const int64_t* words, std::vector<rollout::GenerationRequest>& requests) {
  const int64_t count = *words++;
  for (int64_t i = 0; i < count; ++i) {
    rollout::GenerationRequest request;
    rollout::SamplingParams& s = request.sampling;
    s.seed = static_cast<uint64_t>(words[0]);
    s.temperature = std::bit_cast<double>(words[1]);
    s.top_k = words[2];
    s.top_p = std::bit_cast<double>(words[3]);
    s.max_new_tokens = words[4];
    s.n = words[5];
    s.ignore_eos = words[6] != 0;
    const int64_t stops = words[7], length = words[8];
    words += 9;
    s.stop_token_ids.assign(words, words + stops);
    words += stops;
    request.prompt_ids.assign(words, words + length);
    words += length;
    requests.push_back(std::move(request));
  }
}

}  // namespace

absl::StatusOr<std::vector<rollout::GenerationResult>> ActorRole::RunTensorParallel(
    const std::vector<rollout::GenerationRequest>& requests) {
  parallel::Communicator& group = *tp_group_;
  // The group decodes its ranks' prompts together: every rank's requests, in rank order.
  std::vector<int64_t> mine;
  AppendRequests(requests, mine);
  at::Tensor size = at::tensor({static_cast<int64_t>(mine.size())}, at::kLong);
  at::Tensor sizes = at::empty({group.size()}, at::kLong);
  RETURN_IF_ERROR(group.AllGather(size, sizes));
  const int64_t longest = sizes.max().item<int64_t>();
  at::Tensor padded = at::zeros({1, longest}, at::kLong);
  std::copy(mine.begin(), mine.end(), padded.data_ptr<int64_t>());
  at::Tensor everyone = at::empty({group.size(), longest}, at::kLong);
  RETURN_IF_ERROR(group.AllGather(padded, everyone));
  std::vector<rollout::GenerationRequest> all;
  size_t first = 0;
  for (int r = 0; r < group.size(); ++r) {
    if (r == group.rank()) first = all.size();
    ReadRequests(everyone[r].data_ptr<int64_t>(), all);
  }

  // This rank's slices, cut from the current weights (views where a slice is a run of them).
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(model::Transformer weights,
                   WeightsIn(WeightDtype(spec_, device_, /*trains=*/false)));
  const model::ModelConfig& config = weights->config();
  const int tp = group.size();
  const parallel::RolloutLayout layout{tp, pool_.size() / tp};
  auto named = weights->named_parameters();
  std::map<std::string, at::Tensor> slices;
  for (const parallel::ShardedParameter& parameter : parallel::TensorParallelSpecs(config)) {
    slices[parameter.name] =
        parallel::RolloutSlice(named[parameter.name].detach(), parameter, layout, pool_.rank());
  }
  ASSIGN_OR_RETURN(parallel::TensorParallelTransformer model,
                   parallel::TensorParallelTransformer::Create(config, std::move(slices), group));
  tensor_parallel_.emplace(std::move(model));
  weights_update_s_ = Seconds(start);
  ASSIGN_OR_RETURN(std::vector<rollout::GenerationResult> results,
                   rollout::GenerateTensorParallel(*tensor_parallel_, all, config.eos_token_ids,
                                                   config.vocab_size));
  tensor_parallel_.reset();
  ReleaseCopy();
  return std::vector<rollout::GenerationResult>(
      std::make_move_iterator(results.begin() + static_cast<std::ptrdiff_t>(first)),
      std::make_move_iterator(results.begin() +
                              static_cast<std::ptrdiff_t>(first + requests.size())));
}

absl::StatusOr<std::vector<rollout::GenerationResult>> ActorRole::RunEngine(
    const std::vector<rollout::GenerationRequest>& requests) {
  if (tp_group_) {
    try {
      return RunTensorParallel(requests);
    } catch (const std::exception& error) {
      ReleaseRollout();
      return absl::InternalError(absl::StrCat("tensor-parallel generation failed: ",
                                              std::string(error.what()).substr(0, 300)));
    }
  }
  ASSIGN_OR_RETURN(rollout::GenerationEngine * engine, Engine());
  try {
    at::NoGradGuard no_grad;
    return engine->Generate(requests);
  } catch (const std::exception& error) {
    ReleaseRollout();
    engine_.reset();
    return absl::InternalError(
        absl::StrCat("generation failed: ", std::string(error.what()).substr(0, 300)));
  }
}

absl::StatusOr<v1::GenerateReply> ActorRole::Generate(const v1::GenerateRequest& request,
                                                      int64_t total_rows, RowRange rows,
                                                      StepBatch& batch) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t n = spec_.roles().actor().rollout().n();
  const int64_t prompts = request.prompts_size();
  if (prompts * n != rows.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generate: this rank holds rows [", rows.begin, ", ", rows.end, ") of ", total_rows,
        ", which is ", rows.size(), " responses, but was given ", prompts, " prompts x n ", n));
  }
  std::vector<rollout::GenerationRequest> requests;
  std::vector<std::string> prompt_texts;
  const rollout::SamplingParams sampling = TrainingSampling(spec_);
  for (int64_t i = 0; i < prompts; ++i) {
    const int64_t index = request.first_prompt() + i;
    ASSIGN_OR_RETURN(EncodedPrompt encoded,
                     EncodePrompt(tokenizer_, request.prompts(i), spec_.data(), index));
    rollout::GenerationRequest generation{std::move(encoded.ids), sampling};
    generation.sampling.seed = PromptSeed(request.seed(), index);
    requests.push_back(std::move(generation));
    prompt_texts.push_back(std::move(encoded.text));
  }
  ASSIGN_OR_RETURN(std::vector<rollout::GenerationResult> results, RunEngine(requests));
  if (engine_) engine_->Release();  // the KV cache: the update needs the memory

  // P and R over the whole batch: every rank of the pool lays its rows out the same way.
  std::vector<double> longest = {1, 1};
  for (int64_t i = 0; i < prompts; ++i) {
    longest[0] = std::max<double>(longest[0], requests[i].prompt_ids.size());
    for (const rollout::Completion& sample : results[i].samples) {
      longest[1] = std::max<double>(longest[1], sample.token_ids.size());
    }
  }
  RETURN_IF_ERROR(ReduceLongest(longest));
  const int64_t p = static_cast<int64_t>(longest[0]), r = static_cast<int64_t>(longest[1]);

  const int64_t local = rows.size();
  at::Tensor input_ids = at::zeros({local, p + r}, at::kLong);
  at::Tensor attention_mask = at::zeros({local, p + r}, at::kLong);
  at::Tensor response_mask = at::zeros({local, r}, at::kFloat);
  at::Tensor rollout_log_probs = at::zeros({local, r}, at::kFloat);
  batch.Begin(request.key().step(), total_rows, rows, p, r);
  v1::GenerateReply reply;
  double response_tokens = 0, truncated = 0, prompt_tokens = 0;
  int64_t row = 0;
  for (int64_t i = 0; i < prompts; ++i) {
    const std::vector<int64_t>& prompt = requests[i].prompt_ids;
    const int64_t length = static_cast<int64_t>(prompt.size());
    for (const rollout::Completion& sample : results[i].samples) {
      const int64_t produced = static_cast<int64_t>(sample.token_ids.size());
      input_ids[row].narrow(0, p - length, length).copy_(at::tensor(prompt, at::kLong));
      attention_mask[row].narrow(0, p - length, length).fill_(1);
      if (produced > 0) {
        input_ids[row].narrow(0, p, produced).copy_(at::tensor(sample.token_ids, at::kLong));
        attention_mask[row].narrow(0, p, produced).fill_(1);
        response_mask[row].narrow(0, 0, produced).fill_(1);
        rollout_log_probs[row].narrow(0, 0, produced).copy_(at::tensor(sample.logprobs));
      }
      v1::RowInfo* info = reply.add_rows();
      info->set_prompt_tokens(static_cast<int32_t>(length));
      info->set_response_tokens(static_cast<int32_t>(produced));
      info->set_truncated(sample.finish_reason == rollout::FinishReason::kLength);
      batch.sources().push_back({request.prompts(i).ground_truth_json(),
                                 request.prompts(i).data_source(), prompt_texts[i]});
      response_tokens += static_cast<double>(produced);
      prompt_tokens += static_cast<double>(length);
      truncated += info->truncated() ? 1 : 0;
      ++row;
    }
  }
  RETURN_IF_ERROR(batch.Put("input_ids", input_ids.to(device_)));
  RETURN_IF_ERROR(batch.Put("attention_mask", attention_mask.to(device_)));
  RETURN_IF_ERROR(batch.Put("response_mask", response_mask.to(device_)));
  RETURN_IF_ERROR(batch.Put("rollout_log_probs", rollout_log_probs.to(device_)));
  reply.set_prompt_length(static_cast<int32_t>(p));
  reply.set_response_length(static_cast<int32_t>(r));
  const double seconds = Seconds(start);
  auto& metrics = *reply.mutable_metrics();
  metrics["generate_s"] = seconds;
  metrics["update_weights_s"] = weights_update_s_;
  metrics["response_tokens"] = response_tokens;
  metrics["prompt_tokens"] = prompt_tokens;
  metrics["truncated"] = truncated;
  metrics["tokens_per_s"] = response_tokens / std::max(seconds, 1e-9);
  return reply;
}

absl::Status ActorRole::ReduceLongest(std::vector<double>& longest) {
  return trained_->ReduceOverReplicas(longest, train::ReplicaReduce::kMax);
}

absl::Status ActorRole::ComputeOldLogProbs(StepBatch& batch) {
  ASSIGN_OR_RETURN(const at::Tensor ids, batch.Get("input_ids", "old log-probs"));
  ASSIGN_OR_RETURN(const at::Tensor mask, batch.Get("attention_mask", "old log-probs"));
  ReleaseRollout();
  ComputeScope compute(spec_, device_);
  RETURN_IF_ERROR(trained_->BeginStep());
  absl::StatusOr<at::Tensor> log_probs =
      ResponseLogProbs(trained_->module(), ids, mask, batch.prompt_length(),
                       spec_.roles().actor().rollout().log_prob_micro_batch_size_per_gpu());
  trained_->EndForwards();
  RETURN_IF_ERROR(trained_->TakeStatus());
  if (!log_probs.ok()) return log_probs.status();
  return batch.Put("old_log_probs", *log_probs);
}

absl::StatusOr<v1::UpdateReply> ActorRole::Update(const v1::UpdateRequest& request,
                                                  StepBatch& batch) {
  ReleaseRollout();
  const v1::AlgorithmSpec& algorithm = spec_.algorithm();
  const bool kl_loss = algorithm.kl().mode() == v1::KL_MODE_LOSS && algorithm.kl().coef() > 0;
  const int64_t p = batch.prompt_length();
  train::PolicyUpdateBatch update;
  ASSIGN_OR_RETURN(update.input_ids, batch.Get("input_ids", "the actor update"));
  ASSIGN_OR_RETURN(update.attention_mask, batch.Get("attention_mask", "the actor update"));
  ASSIGN_OR_RETURN(const at::Tensor response_mask, batch.Get("response_mask", "the actor update"));
  ASSIGN_OR_RETURN(const at::Tensor advantages, batch.Get("advantages", "the actor update"));
  // On-policy the driver skips the old-log-prob forward and the update takes its own
  // log-probs, detached, as the old ones (verl's actor does the same).
  if (!algorithms::ActorUpdateIsOnPolicy(spec_)) {
    ASSIGN_OR_RETURN(const at::Tensor old_log_probs,
                     batch.Get("old_log_probs", "the actor update"));
    update.old_log_probs = ToTrainingLayout(old_log_probs, p);
  }
  update.response_mask = ToTrainingLayout(response_mask, p);
  update.advantages = ToTrainingLayout(advantages, p);
  if (kl_loss) {
    ASSIGN_OR_RETURN(const at::Tensor ref, batch.Get("ref_log_probs", "the actor's KL loss"));
    update.ref_log_probs = ToTrainingLayout(ref, p);
  }
  const v1::TrainSpec& train = spec_.roles().actor().train();
  train::PolicyUpdateOptions options;
  options.loop =
      UpdateLoopOptionsOf(spec_, "actor", train, trained_->replicas(), request.key().step(),
                          &*schedule_, request.optimizer_steps_before(), nonfinite_skips_);
  options.policy = {.clip_ratio_low = algorithm.clip_ratio_low(),
                    .clip_ratio_high = algorithm.clip_ratio_high(),
                    .clip_ratio_c = algorithm.clip_ratio_c(),
                    .aggregation = algorithm.loss_agg_mode()};
  options.entropy_coeff = algorithm.entropy_coeff();
  options.kl_coef = kl_loss ? algorithm.kl().coef() : 0.0;
  options.kl_estimator = algorithm.kl().estimator();
  ComputeScope compute(spec_, device_);
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const train::UpdateMetrics metrics,
                   train::UpdatePolicy(*trained_, update, options));
  rollout::Synchronize(device_);
  const double seconds = Seconds(start);
  // The gradients are spent: their memory goes back before the next rollout.
  trained_->ZeroGrad();
  v1::UpdateReply reply;
  auto& out = *reply.mutable_metrics();
  for (const auto& [name, value] : metrics) out[name] = value;
  // verl's perf/mfu/actor over this rank's rows (the driver averages the ranks), and the
  // device's peak memory so far (GPU only: the CPU has no allocator statistics to read).
  const at::Tensor lengths = update.attention_mask.sum(1).to(at::kCPU, at::kLong).contiguous();
  const std::vector<int64_t> tokens(lengths.data_ptr<int64_t>(),
                                    lengths.data_ptr<int64_t>() + lengths.numel());
  const double promised = train::PromisedFlops(rollout::DeviceName(device_));
  out["mfu"] = promised <= 0
                   ? 0.0
                   : train::TrainingFlops(trained_->module()->config(), tokens) *
                         std::max(1, train.ppo_epochs()) / std::max(seconds, 1e-9) / promised;
  if (device_.is_cuda()) {
    const rollout::DeviceMemory memory = rollout::QueryDeviceMemory(device_);
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    out["max_memory_allocated_gb"] = static_cast<double>(memory.peak_allocated_bytes) / kGiB;
    out["max_memory_reserved_gb"] = static_cast<double>(memory.peak_reserved_bytes) / kGiB;
  }
  optimizer_steps_ =
      request.optimizer_steps_before() +
      static_cast<int64_t>(metrics.count("optimizer_steps") ? metrics.at("optimizer_steps") : 0);
  reply.set_optimizer_steps(optimizer_steps_);
  if (const auto skips = metrics.find("nonfinite_skips"); skips != metrics.end()) {
    nonfinite_skips_ += static_cast<int64_t>(skips->second);
  }
  return reply;
}

absl::StatusOr<v1::ValidateReply> ActorRole::Validate(const v1::ValidateRequest& request,
                                                      int64_t first_prompt,
                                                      const ResponseScorer& scorer,
                                                      const std::atomic<bool>* cancelled) {
  return GenerateAndScore(request.prompts(), first_prompt, request.seed(),
                          ValidationSampling(spec_), scorer, cancelled);
}

absl::StatusOr<std::vector<double>> ActorRole::GreedyBaseline(const v1::GenerateRequest& request,
                                                              const ResponseScorer& scorer,
                                                              const std::atomic<bool>* cancelled) {
  rollout::SamplingParams greedy = TrainingSampling(spec_);
  greedy.n = 1;
  greedy.temperature = 0;
  greedy.top_k = 0;
  greedy.top_p = 1.0;
  ASSIGN_OR_RETURN(const v1::ValidateReply scored,
                   GenerateAndScore(request.prompts(), request.first_prompt(), request.seed(),
                                    greedy, scorer, cancelled));
  return std::vector<double>(scored.scores().begin(), scored.scores().end());
}

absl::StatusOr<v1::ValidateReply> ActorRole::GenerateAndScore(
    const google::protobuf::RepeatedPtrField<v1::PromptRow>& prompts, int64_t first_prompt,
    uint64_t seed, const rollout::SamplingParams& sampling, const ResponseScorer& scorer,
    const std::atomic<bool>* cancelled) {
  std::vector<rollout::GenerationRequest> requests;
  std::vector<std::string> prompt_texts;
  for (int64_t i = 0; i < prompts.size(); ++i) {
    ASSIGN_OR_RETURN(EncodedPrompt encoded,
                     EncodePrompt(tokenizer_, prompts[i], spec_.data(), first_prompt + i));
    rollout::GenerationRequest generation{std::move(encoded.ids), sampling};
    generation.sampling.seed = PromptSeed(seed, first_prompt + i);
    requests.push_back(std::move(generation));
    prompt_texts.push_back(std::move(encoded.text));
  }
  ASSIGN_OR_RETURN(std::vector<rollout::GenerationResult> results, RunEngine(requests));
  ReleaseRollout();
  v1::ValidateReply reply;
  std::vector<ScoredResponse> scored;
  for (int64_t i = 0; i < prompts.size(); ++i) {
    for (const rollout::Completion& sample : results[i].samples) {
      const std::vector<int32_t> ids(sample.token_ids.begin(), sample.token_ids.end());
      std::string text = tokenizer_.Decode(ids, /*skip_special_tokens=*/true);
      v1::RowInfo* info = reply.add_rows();
      info->set_prompt_tokens(static_cast<int32_t>(requests[i].prompt_ids.size()));
      info->set_response_tokens(static_cast<int32_t>(ids.size()));
      info->set_truncated(sample.finish_reason == rollout::FinishReason::kLength);
      reply.add_responses(text);
      scored.push_back({prompt_texts[i], std::move(text), prompts[i].ground_truth_json(),
                        prompts[i].data_source()});
    }
  }
  ASSIGN_OR_RETURN(const std::vector<double> scores, scorer.Score(scored, first_prompt, cancelled));
  for (double score : scores) reply.add_scores(score);
  return reply;
}

}  // namespace rlhfd::roles
