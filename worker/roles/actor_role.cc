#include "worker/roles/actor_role.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/algorithms/algorithm_traits.h"
#include "common/algorithms/on_policy.h"
#include "common/logging/logging.h"
#include "common/status/status_macros.h"
#include "common/util/stopwatch.h"
#include "worker/model/model_loader.h"
#include "worker/roles/forward_passes.h"
#include "worker/roles/prompt_encoding.h"
#include "worker/roles/rollout_sampling.h"
#include "worker/roles/training_setup.h"
#include "worker/rollout/device_support.h"
#include "worker/train/flops_estimate.h"
#include "worker/train/policy_update.h"
#include "worker/train/rollout_correction.h"

namespace rlhfd::roles {
namespace {

void KeepPeaks(const rollout::DeviceMemory& memory, rollout::DeviceMemory& peaks) {
  peaks.peak_allocated_bytes = std::max(peaks.peak_allocated_bytes, memory.peak_allocated_bytes);
  peaks.peak_reserved_bytes = std::max(peaks.peak_reserved_bytes, memory.peak_reserved_bytes);
}

// The step's rows in verl's layout (each prompt left-padded to P, its responses right-padded to
// R, as `batch` began them) on `device`, each row's source, and each row's info and the token
// counts in `reply`.
absl::Status PutRollout(const v1::GenerateRequest& request, const PromptRequests& encoded,
                        const std::vector<rollout::GenerationResult>& results,
                        const at::Device& device, StepBatch& batch, v1::GenerateReply& reply) {
  const int64_t p = batch.prompt_length(), r = batch.response_length();
  const int64_t local = batch.rows().size();
  at::Tensor input_ids = at::zeros({local, p + r}, at::kLong);
  at::Tensor attention_mask = at::zeros({local, p + r}, at::kLong);
  at::Tensor response_mask = at::zeros({local, r}, at::kFloat);
  at::Tensor rollout_log_probs = at::zeros({local, r}, at::kFloat);
  double response_tokens = 0, truncated = 0, prompt_tokens = 0;
  int64_t row = 0;
  for (int64_t i = 0; i < request.prompts_size(); ++i) {
    const std::vector<int64_t>& prompt = encoded.requests[i].prompt_ids;
    const int64_t length = static_cast<int64_t>(prompt.size());
    for (const rollout::Completion& sample : results[i].samples) {
      const int64_t produced = static_cast<int64_t>(sample.token_ids.size());
      input_ids[row].narrow(0, p - length, length).copy_(at::tensor(prompt, at::kLong));
      attention_mask[row].narrow(0, p - length, length).fill_(1);
      if (produced > 0) {
        input_ids[row].narrow(0, p, produced).copy_(at::tensor(sample.token_ids, at::kLong));
        attention_mask[row].narrow(0, p, produced).fill_(1);
        // 1 where the model sampled, 0 where a multi-turn rollout inserted a tool's response:
        // those tokens are read, but are no action of the policy's (verl's response_mask).
        response_mask[row]
            .narrow(0, 0, produced)
            .copy_(at::tensor(
                std::vector<float>(sample.response_mask.begin(), sample.response_mask.end())));
        rollout_log_probs[row].narrow(0, 0, produced).copy_(at::tensor(sample.logprobs));
      }
      v1::RowInfo* info = reply.add_rows();
      info->set_prompt_tokens(static_cast<int32_t>(length));
      info->set_response_tokens(static_cast<int32_t>(produced));
      info->set_truncated(sample.finish_reason == rollout::FinishReason::kLength);
      batch.sources().push_back({request.prompts(i).ground_truth_json(),
                                 request.prompts(i).data_source(), encoded.texts[i],
                                 request.prompts(i).extra_info_json()});
      response_tokens += static_cast<double>(produced);
      prompt_tokens += static_cast<double>(length);
      truncated += info->truncated() ? 1 : 0;
      ++row;
    }
  }
  RETURN_IF_ERROR(batch.Put("input_ids", input_ids.to(device)));
  RETURN_IF_ERROR(batch.Put("attention_mask", attention_mask.to(device)));
  RETURN_IF_ERROR(batch.Put("response_mask", response_mask.to(device)));
  RETURN_IF_ERROR(batch.Put("rollout_log_probs", rollout_log_probs.to(device)));
  auto& metrics = *reply.mutable_metrics();
  metrics["response_tokens"] = response_tokens;
  metrics["prompt_tokens"] = prompt_tokens;
  metrics["truncated"] = truncated;
  return absl::OkStatus();
}

}  // namespace

ActorRole::ActorRole(const v1::JobSpec& spec, const at::Device& device, model::Tokenizer tokenizer)
    : spec_(spec), device_(device), tokenizer_(std::move(tokenizer)) {}

absl::StatusOr<std::unique_ptr<ActorRole>> ActorRole::Create(
    const v1::JobSpec& spec, const at::Device& device, const JobLayout& layout,
    parallel::Communicator& pool, int64_t rl_steps, RolloutWeightsHook hook) {
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
  // A LoRA actor's base is frozen: in the rollout's dtype, never float32 masters.
  const bool lora = UsesLora(spec);
  load.dtype = WeightDtype(spec, device, /*trains=*/!lora);
  load.device = device;
  load.head = model::HeadNeed::kCausalLm;
  load.max_sequence_length = spec.data().max_prompt_length() + ResponseBudget(spec);
  load.sequence_what = "data.max_prompt_length + the response budget";
  ASSIGN_OR_RETURN(model::Transformer module, model::LoadModel(model_spec.path(), load));
  RETURN_IF_ERROR(
      model::CheckTokenizerFitsModel(tokenizer, module->config().vocab_size, model_spec.path()));
  module->train();
  std::optional<model::LoraOptions> lora_options;
  if (lora) {
    ASSIGN_OR_RETURN(lora_options, AddJobLoraAdapters(spec, module));
  }
  // The rollout's tensor-parallel group is split before the training layout is made, in the same
  // order on every rank.
  ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> tp_group,
                   SplitRolloutGroup(spec, device, layout, pool));
  auto role = std::unique_ptr<ActorRole>(new ActorRole(spec, device, std::move(tokenizer)));
  role->lora_ = std::move(lora_options);
  const v1::TrainSpec& train = spec.roles().actor().train();
  role->trained_ = MakeTrainedModel(std::move(module), train, pool);
  role->schedule_.emplace(train,
                          std::max<int64_t>(1, rl_steps * OptimizerStepsPerRlStep(spec, train)));
  // Every rank of the pool counts the pool's ranks on its GPU here, together.
  ASSIGN_OR_RETURN(const int64_t ranks_on_device, rollout::RanksOnThisDevice(pool, device));
  role->hybrid_ =
      std::make_unique<HybridEngine>(role->spec_, device, pool, *role->trained_,
                                     std::move(tp_group), ranks_on_device, std::move(hook));
  ASSIGN_OR_RETURN(role->agent_, AgentRollout::Create(role->spec_, role->tokenizer_));
  return role;
}

absl::StatusOr<std::vector<rollout::GenerationResult>> ActorRole::Rollout(
    const std::vector<rollout::GenerationRequest>& requests, int64_t step,
    google::protobuf::Map<std::string, double>& metrics) {
  if (!agent_) return hybrid_->Generate(requests, step);
  absl::StatusOr<std::vector<rollout::GenerationResult>> results =
      agent_->Generate(*hybrid_, requests, step);
  if (results.ok()) {
    std::map<std::string, double> turns;
    agent_->AddTurnMetrics(turns);
    for (const auto& [name, value] : turns) metrics[name] = value;
  }
  return results;
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
  ASSIGN_OR_RETURN(
      const PromptRequests encoded,
      EncodeRequests(tokenizer_, request.prompts(), spec_.data(), request.first_prompt(),
                     request.seed(), TrainingSampling(spec_), prompt_tools()));
  google::protobuf::Map<std::string, double> turn_metrics;
  ASSIGN_OR_RETURN(const std::vector<rollout::GenerationResult> results,
                   Rollout(encoded.requests, request.key().step(), turn_metrics));
  // This rank's own generating (its tensor-parallel group's), the weights' update left out:
  // generate_s also holds the wait for the other replicas below, so only this tells a slow
  // host apart (the driver's perf/straggler/gen/*).
  const double rollout_seconds = std::max(0.0, SecondsSince(start) - hybrid_->weights_update_s());
  hybrid_->ReleaseCache();  // the update needs the memory

  // P and R over the whole batch: every rank of the pool lays its rows out the same way.
  std::vector<double> longest = {1, 1};
  for (int64_t i = 0; i < prompts; ++i) {
    longest[0] = std::max<double>(longest[0], encoded.requests[i].prompt_ids.size());
    for (const rollout::Completion& sample : results[i].samples) {
      longest[1] = std::max<double>(longest[1], sample.token_ids.size());
    }
  }
  RETURN_IF_ERROR(ReduceLongest(longest));
  const int64_t p = static_cast<int64_t>(longest[0]), r = static_cast<int64_t>(longest[1]);

  batch.Begin(request.key().step(), total_rows, rows, p, r);
  v1::GenerateReply reply;
  RETURN_IF_ERROR(PutRollout(request, encoded, results, device_, batch, reply));
  if (algorithms::OldLogProbsFromRollout(spec_)) {
    // verl's bypass mode: the rollout's log-probs are the old ones.
    ASSIGN_OR_RETURN(const at::Tensor rollout_log_probs, batch.Get("rollout_log_probs", "bypass"));
    RETURN_IF_ERROR(batch.Put("old_log_probs", rollout_log_probs.clone()));
  }
  reply.set_prompt_length(static_cast<int32_t>(p));
  reply.set_response_length(static_cast<int32_t>(r));
  const double seconds = SecondsSince(start);
  auto& metrics = *reply.mutable_metrics();
  metrics.insert(turn_metrics.begin(), turn_metrics.end());
  metrics["generate_s"] = seconds;
  metrics["rollout_s"] = rollout_seconds;
  metrics["update_weights_s"] = hybrid_->weights_update_s();
  if (const parallel::ReshardStats* reshard = hybrid_->reshard_stats()) {
    // The reshard's transient memory (its send and receive buffers, at most a bucket) and the
    // slices it leaves this rank.
    metrics["reshard_buffer_bytes"] = static_cast<double>(reshard->buffer_bytes);
    metrics["reshard_received_bytes"] = static_cast<double>(reshard->received_bytes);
  }
  if (const std::optional<WeightSyncCheck>& check = hybrid_->last_check()) {
    metrics["weight_sync_ok"] = 1;
    metrics["weight_sync_check_s"] = check->seconds;
    metrics["rollout_weights_checksum"] = check->checksum;
  }
  metrics["tokens_per_s"] = metrics["response_tokens"] / std::max(seconds, 1e-9);
  return reply;
}

absl::Status ActorRole::ReduceLongest(std::vector<double>& longest) {
  return trained_->ReduceOverReplicas(longest, train::ReplicaReduce::kMax);
}

absl::StatusOr<std::map<std::string, double>> ActorRole::ComputeOldLogProbs(StepBatch& batch) {
  ASSIGN_OR_RETURN(const at::Tensor ids, batch.Get("input_ids", "old log-probs"));
  ASSIGN_OR_RETURN(const at::Tensor mask, batch.Get("attention_mask", "old log-probs"));
  ASSIGN_OR_RETURN(const at::Tensor rollout_log_probs,
                   batch.Get("rollout_log_probs", "old log-probs"));
  ASSIGN_OR_RETURN(const at::Tensor response_mask, batch.Get("response_mask", "old log-probs"));
  ReleaseRollout();
  ComputeScope compute(spec_, device_);
  RETURN_IF_ERROR(trained_->BeginStep());
  absl::StatusOr<at::Tensor> log_probs =
      ResponseLogProbs(trained_->module(), ids, mask, batch.prompt_length(),
                       spec_.roles().actor().rollout().log_prob_micro_batch_size_per_gpu(),
                       LogProbTemperature(spec_));
  trained_->EndForwards();
  RETURN_IF_ERROR(trained_->TakeStatus());
  if (!log_probs.ok()) return log_probs.status();
  RETURN_IF_ERROR(batch.Put("old_log_probs", *log_probs));
  return train::RolloutProbsDiffMetrics(
      *log_probs, rollout_log_probs, response_mask, [&](std::vector<double>& values, bool maximum) {
        return trained_->ReduceOverReplicas(
            values, maximum ? train::ReplicaReduce::kMax : train::ReplicaReduce::kSum);
      });
}

absl::StatusOr<v1::UpdateReply> ActorRole::Update(const v1::UpdateRequest& request,
                                                  StepBatch& batch) {
  ReleaseRollout();
  const v1::AlgorithmSpec& algorithm = spec_.algorithm();
  const bool kl_loss = algorithms::KlInLoss(algorithm) && algorithm.kl().coef() > 0;
  const int64_t p = batch.prompt_length();
  train::PolicyUpdateBatch update;
  ASSIGN_OR_RETURN(update.input_ids, batch.Get("input_ids", "the actor update"));
  ASSIGN_OR_RETURN(update.attention_mask, batch.Get("attention_mask", "the actor update"));
  ASSIGN_OR_RETURN(const at::Tensor response_mask, batch.Get("response_mask", "the actor update"));
  ASSIGN_OR_RETURN(const at::Tensor advantages, batch.Get("advantages", "the actor update"));
  // On-policy the driver skips the old-log-prob forward and the update takes its own
  // log-probs, detached, as the old ones (verl's actor does the same).
  at::Tensor old_log_probs;
  if (algorithms::UpdateReadsOldLogProbs(spec_)) {
    ASSIGN_OR_RETURN(old_log_probs, batch.Get("old_log_probs", "the actor update"));
    update.old_log_probs = ToTrainingLayout(old_log_probs, p);
  }
  std::map<std::string, double> correction_metrics;
  if (algorithms::AppliesRolloutIsWeights(spec_)) {
    ASSIGN_OR_RETURN(const at::Tensor rollout_log_probs,
                     batch.Get("rollout_log_probs", "the rollout correction"));
    const v1::RolloutCorrectionSpec& correction = spec_.algorithm().rollout_correction();
    ASSIGN_OR_RETURN(train::RolloutCorrection weights,
                     train::ComputeRolloutCorrection(
                         old_log_probs, rollout_log_probs, response_mask,
                         {.sequence = correction.rollout_is() == "sequence",
                          .threshold = correction.rollout_is_threshold(),
                          .batch_normalize = correction.rollout_is_batch_normalize()},
                         [&](std::vector<double>& values, bool maximum) {
                           return trained_->ReduceOverReplicas(
                               values,
                               maximum ? train::ReplicaReduce::kMax : train::ReplicaReduce::kSum);
                         }));
    update.rollout_is_weights = ToTrainingLayout(weights.weights, p);
    correction_metrics = std::move(weights.metrics);
  }
  update.response_mask = ToTrainingLayout(response_mask, p);
  update.advantages = ToTrainingLayout(advantages, p);
  if (kl_loss) {
    ASSIGN_OR_RETURN(const at::Tensor ref, batch.Get("ref_log_probs", "the actor's KL loss"));
    update.ref_log_probs = ToTrainingLayout(ref, p);
  }
  const v1::TrainSpec& train = spec_.roles().actor().train();
  const train::PolicyUpdateOptions options =
      PolicyUpdateOptionsOf(spec_, trained_->replicas(), request.key().step(), &*schedule_,
                            request.optimizer_steps_before(), nonfinite_skips_);
  ComputeScope compute(spec_, device_);
  // The peak so far (the rollout's cache included) is kept, then the allocator's peak restarts,
  // so that the update's own peak can be told apart from it.
  if (device_.is_cuda()) {
    KeepPeaks(rollout::QueryDeviceMemory(device_), peaks_);
    rollout::ResetPeakMemory(device_);
  }
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const train::UpdateMetrics metrics,
                   train::UpdatePolicy(*trained_, update, options));
  rollout::Synchronize(device_);
  const double seconds = SecondsSince(start);
  // The gradients are spent: their memory goes back before the next rollout.
  trained_->ZeroGrad();
  v1::UpdateReply reply;
  auto& out = *reply.mutable_metrics();
  for (const auto& [name, value] : metrics) out[name] = value;
  for (const auto& [name, value] : correction_metrics) out[name] = value;
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
    const rollout::DeviceMemory update_memory = rollout::QueryDeviceMemory(device_);
    KeepPeaks(update_memory, peaks_);
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    out["max_memory_allocated_gb"] = static_cast<double>(peaks_.peak_allocated_bytes) / kGiB;
    out["max_memory_reserved_gb"] = static_cast<double>(peaks_.peak_reserved_bytes) / kGiB;
    out["update_max_memory_allocated_gb"] =
        static_cast<double>(update_memory.peak_allocated_bytes) / kGiB;
  }
  optimizer_steps_ =
      request.optimizer_steps_before() +
      static_cast<int64_t>(metrics.count("optimizer_steps") ? metrics.at("optimizer_steps") : 0);
  reply.set_optimizer_steps(optimizer_steps_);
  // The checksum the next checked rollout over these weights must report (one_step_off: the
  // rollout after next is the first to use them).
  const int64_t used_by =
      request.key().step() + (spec_.trainer().mode() == v1::TRAINER_MODE_ONE_STEP_OFF ? 2 : 1);
  if (WeightSyncCheckDue(spec_, used_by)) {
    ASSIGN_OR_RETURN(const double checksum, hybrid_->TrainedWeightsChecksum());
    out["weights_checksum"] = checksum;
  }
  if (const auto skips = metrics.find("nonfinite_skips"); skips != metrics.end()) {
    nonfinite_skips_ += static_cast<int64_t>(skips->second);
  }
  return reply;
}

}  // namespace rlhfd::roles
