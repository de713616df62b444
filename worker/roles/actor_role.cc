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
#include "worker/device/device_memory.h"
#include "worker/model/model_loader.h"
#include "worker/roles/forward_passes.h"
#include "worker/roles/generated_rows.h"
#include "worker/roles/prompt_encoding.h"
#include "worker/roles/rollout_sampling.h"
#include "worker/roles/supervised_rows.h"
#include "worker/roles/training_setup.h"
#include "worker/rollout/device_support.h"
#include "worker/train/flops_estimate.h"
#include "worker/train/policy_update.h"
#include "worker/train/rollout_correction.h"

namespace rlhfd::roles {
namespace {

void KeepPeaks(const worker::DeviceMemory& memory, worker::DeviceMemory& peaks) {
  peaks.peak_allocated_bytes = std::max(peaks.peak_allocated_bytes, memory.peak_allocated_bytes);
  peaks.peak_reserved_bytes = std::max(peaks.peak_reserved_bytes, memory.peak_reserved_bytes);
}

}  // namespace

ActorRole::ActorRole(const v1::JobSpec& spec, const at::Device& device, model::Tokenizer tokenizer)
    : spec_(spec), device_(device), tokenizer_(std::move(tokenizer)) {}

absl::StatusOr<std::unique_ptr<ActorRole>> ActorRole::Create(
    const v1::JobSpec& spec, const at::Device& device, const JobLayout& layout,
    parallel::Communicator& pool, int64_t rl_steps, RolloutWeightsHook hook) {
  const v1::ModelSpec& model_spec = spec.model();
  ASSIGN_OR_RETURN(model::Tokenizer tokenizer, LoadJobTokenizer(spec));
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
                   SplitRolloutGroup(spec, layout, v1::ROLE_ACTOR, pool));
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
  absl::StatusOr<std::vector<rollout::GenerationResult>> results =
      agent_ ? agent_->Generate(*hybrid_, requests, step) : hybrid_->Generate(requests, step);
  metrics["preemptions"] = static_cast<double>(hybrid_->preemptions());
  if (results.ok() && agent_) {
    std::map<std::string, double> turns;
    agent_->AddTurnMetrics(turns);
    for (const auto& [name, value] : turns) metrics[name] = value;
  }
  return results;
}

absl::StatusOr<v1::GenerateReply> ActorRole::Generate(const v1::GenerateRequest& request,
                                                      int64_t total_rows, RowRange rows,
                                                      StepBatch& batch) {
  RowsGenerator generator{
      .spec = spec_,
      .tokenizer = tokenizer_,
      .device = device_,
      .tools = prompt_tools(),
      .rollout = [this, &request](const std::vector<rollout::GenerationRequest>& requests,
                                  int64_t step, google::protobuf::Map<std::string, double>& metrics)
          -> absl::StatusOr<std::vector<rollout::GenerationResult>> {
        // trainer.mode sft: the rows are the conversations' own turns, not generated.
        if (spec_.trainer().mode() == v1::TRAINER_MODE_SFT) {
          return EncodeTargets(tokenizer_, request.prompts(), spec_, request.first_prompt());
        }
        return Rollout(requests, step, metrics);
      },
      .weights_update_s = [this] { return hybrid_->weights_update_s(); },
      .release_cache = [this] { hybrid_->ReleaseCache(); },
      .reduce_longest =
          [this](std::vector<double>& longest) {
            return trained_->ReduceOverReplicas(longest, train::ReplicaReduce::kMax);
          },
  };
  ASSIGN_OR_RETURN(v1::GenerateReply reply,
                   GenerateRows(generator, request, total_rows, rows, batch));
  if (spec_.trainer().mode() == v1::TRAINER_MODE_SFT) return reply;  // no engine ran
  auto& metrics = *reply.mutable_metrics();
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
  return reply;
}

absl::StatusOr<at::Tensor> ActorRole::ResponseLogProbsOf(const StepBatch& batch) {
  ASSIGN_OR_RETURN(const at::Tensor ids, batch.Get("input_ids", "old log-probs"));
  ASSIGN_OR_RETURN(const at::Tensor mask, batch.Get("attention_mask", "old log-probs"));
  ReleaseRollout();
  ComputeScope compute(spec_, device_);
  RETURN_IF_ERROR(trained_->BeginStep());
  absl::StatusOr<at::Tensor> log_probs = ResponseLogProbs(
      trained_->module(), ids, mask, batch.prompt_length(),
      ActorLogProbForwards(spec_, !trained_->module()->PacksWithVarlenAttention(device_),
                           trained_.get()),
      LogProbTemperature(spec_));
  trained_->EndForwards();
  RETURN_IF_ERROR(trained_->TakeStatus());
  return log_probs;
}

absl::StatusOr<std::map<std::string, double>> ActorRole::ComputeOldLogProbs(StepBatch& batch) {
  ASSIGN_OR_RETURN(const at::Tensor rollout_log_probs,
                   batch.Get("rollout_log_probs", "old log-probs"));
  ASSIGN_OR_RETURN(const at::Tensor response_mask, batch.Get("response_mask", "old log-probs"));
  ASSIGN_OR_RETURN(const at::Tensor log_probs, ResponseLogProbsOf(batch));
  RETURN_IF_ERROR(batch.Put("old_log_probs", log_probs));
  return train::RolloutProbsDiffMetrics(
      log_probs, rollout_log_probs, response_mask, [&](std::vector<double>& values, bool maximum) {
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
  update.response_mask = ToTrainingLayout(response_mask, p);
  const train::PolicyUpdateOptions options =
      PolicyUpdateOptionsOf(spec_, trained_->replicas(), request.key().step(), &*schedule_,
                            request.optimizer_steps_before(), nonfinite_skips_);
  std::map<std::string, double> correction_metrics;
  if (options.supervised) return RunUpdate(request, update, options, correction_metrics);
  ASSIGN_OR_RETURN(const at::Tensor advantages, batch.Get("advantages", "the actor update"));
  // On-policy the driver skips the old-log-prob forward and the update takes its own
  // log-probs, detached, as the old ones (verl's actor does the same).
  at::Tensor old_log_probs;
  if (algorithms::UpdateReadsOldLogProbs(spec_)) {
    ASSIGN_OR_RETURN(old_log_probs, batch.Get("old_log_probs", "the actor update"));
    update.old_log_probs = ToTrainingLayout(old_log_probs, p);
  }
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
  update.advantages = ToTrainingLayout(advantages, p);
  if (kl_loss) {
    ASSIGN_OR_RETURN(const at::Tensor ref, batch.Get("ref_log_probs", "the actor's KL loss"));
    update.ref_log_probs = ToTrainingLayout(ref, p);
  }
  return RunUpdate(request, update, options, correction_metrics);
}

absl::StatusOr<v1::UpdateReply> ActorRole::RunUpdate(
    const v1::UpdateRequest& request, const train::PolicyUpdateBatch& update,
    const train::PolicyUpdateOptions& options,
    const std::map<std::string, double>& correction_metrics) {
  const v1::TrainSpec& train = spec_.roles().actor().train();
  ComputeScope compute(spec_, device_);
  // The peak so far (the rollout's cache included) is kept, then the allocator's peak restarts,
  // so that the update's own peak can be told apart from it.
  if (device_.is_cuda()) {
    KeepPeaks(worker::QueryDeviceMemory(device_), peaks_);
    worker::ResetPeakMemory(device_);
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
    const worker::DeviceMemory update_memory = worker::QueryDeviceMemory(device_);
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
  // The checksum the next checked rollout over these weights must report (a rollout pool's
  // rollout: the driver's update stage adds it, PoolWeightSync::TrainedChecksum).
  if (!spec_.roles().has_rollout() &&
      WeightSyncCheckDue(spec_, FirstRolloutAfterUpdate(spec_, request.key().step()))) {
    ASSIGN_OR_RETURN(const double checksum, hybrid_->TrainedWeightsChecksum());
    out["weights_checksum"] = checksum;
  }
  if (const auto skips = metrics.find("nonfinite_skips"); skips != metrics.end()) {
    nonfinite_skips_ += static_cast<int64_t>(skips->second);
  }
  return reply;
}

}  // namespace rlhfd::roles
