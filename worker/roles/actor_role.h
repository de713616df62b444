// The actor: its training-layout weights (the source of truth), rollouts over them through its
// hybrid engine (hybrid_engine.h), the old-log-prob forward and the PPO update. Validation and
// ReMax's greedy baseline generate through it (scored_generation.h).
#pragma once

#include <map>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "rlhfd/v1/worker_service.pb.h"
#include "worker/device/device_memory.h"
#include "worker/model/tokenizer.h"
#include "worker/parallel/communicator.h"
#include "worker/roles/agent_rollout.h"
#include "worker/roles/hosted_role.h"
#include "worker/roles/hybrid_engine.h"
#include "worker/roles/job_layout.h"
#include "worker/roles/step_batch.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/policy_update.h"
#include "worker/train/trained_model.h"

namespace rlhfd::roles {

class ActorRole final : public TrainedRole {
 public:
  // Loads model.path (a causal LM) and its tokenizer on `device`, in the training layout over
  // `pool` (the actor pool of `layout`, which must outlive the role). `rl_steps` sizes the LR
  // schedule.
  static absl::StatusOr<std::unique_ptr<ActorRole>> Create(
      const v1::JobSpec& spec, const at::Device& device, const JobLayout& layout,
      parallel::Communicator& pool, int64_t rl_steps, RolloutWeightsHook hook = nullptr);

  // Generates rollout.n responses to each of this rank's prompts, agrees P and R with the pool,
  // and starts `batch` for the step with this rank's rows (`rows` of `total_rows`): input_ids,
  // attention_mask, response_mask, rollout_log_probs, and each row's source.
  absl::StatusOr<v1::GenerateReply> Generate(const v1::GenerateRequest& request, int64_t total_rows,
                                             RowRange rows, StepBatch& batch);
  // old_log_probs: the response log-probs under the weights that sampled, computed as the
  // update computes them; returns how far the rollout's own log-probs were from them, over every
  // replica (train::RolloutProbsDiffMetrics).
  absl::StatusOr<std::map<std::string, double>> ComputeOldLogProbs(StepBatch& batch);
  // The response log-probs (rows, R) of `batch`'s rows under the current weights, as the
  // old-log-prob forward takes them (its micro-batches; collective under ZeRO-3).
  absl::StatusOr<at::Tensor> ResponseLogProbsOf(const StepBatch& batch);
  // One PPO update over the step's rows (advantages, and ref_log_probs with a KL loss); in
  // trainer.mode sft, the negative log-likelihood of the rows' response tokens.
  absl::StatusOr<v1::UpdateReply> Update(const v1::UpdateRequest& request, StepBatch& batch);
  const model::Tokenizer& tokenizer() const { return tokenizer_; }
  train::TrainedModel& trained() override { return *trained_; }
  int64_t optimizer_steps() const override { return optimizer_steps_; }
  void set_optimizer_steps(int64_t steps) override { optimizer_steps_ = steps; }
  int64_t nonfinite_skips() const override { return nonfinite_skips_; }
  void set_nonfinite_skips(int64_t skips) override { nonfinite_skips_ = skips; }
  // Frees the engine's cache and the storage of any copy of the weights.
  void ReleaseRollout() { hybrid_->Release(); }
  void ReleaseDerived() override { ReleaseRollout(); }
  // A module with the full current weights (the training module itself unless the layout
  // shards them), for exports.
  absl::StatusOr<model::Transformer> FullWeights() { return hybrid_->FullWeights(); }
  // The LoRA adapters' options when the actor trains adapters.
  const std::optional<model::LoraOptions>& lora() const { return lora_; }
  // The module whose base, adapters off, is the reference model on this worker: the actor's,
  // when it trains adapters over a base it holds whole; null otherwise.
  model::Transformer* LoraBase() { return lora_ ? &trained_->module() : nullptr; }
  HybridEngine& hybrid() { return *hybrid_; }
  const v1::JobSpec& spec() const { return spec_; }
  // `requests` generated over the current weights, through the agent loop in a multi-turn job
  // (then with its turns' figures added to `metrics`, AgentRollout::AddTurnMetrics).
  absl::StatusOr<std::vector<rollout::GenerationResult>> Rollout(
      const std::vector<rollout::GenerationRequest>& requests, int64_t step,
      google::protobuf::Map<std::string, double>& metrics);
  // The tool schemas a multi-turn job's chat prompts list; none otherwise.
  absl::Span<const std::string> prompt_tools() const {
    return agent_ ? absl::Span<const std::string>(agent_->prompt_tools())
                  : absl::Span<const std::string>();
  }

 private:
  // Runs `update` and reports it: the update's metrics with `correction_metrics`, MFU, memory.
  absl::StatusOr<v1::UpdateReply> RunUpdate(
      const v1::UpdateRequest& request, const train::PolicyUpdateBatch& update,
      const train::PolicyUpdateOptions& options,
      const std::map<std::string, double>& correction_metrics);
  ActorRole(const v1::JobSpec& spec, const at::Device& device, model::Tokenizer tokenizer);
  v1::JobSpec spec_;
  at::Device device_;
  model::Tokenizer tokenizer_;
  std::unique_ptr<train::TrainedModel> trained_;
  std::optional<train::LrSchedule> schedule_;
  int64_t optimizer_steps_ = 0;
  int64_t nonfinite_skips_ = 0;
  // The device's peaks over the role's life: each update restarts the allocator's peak to
  // measure its own, so the earlier ones are kept here.
  worker::DeviceMemory peaks_;
  std::unique_ptr<HybridEngine> hybrid_;
  std::optional<model::LoraOptions> lora_;
  std::unique_ptr<AgentRollout> agent_;  // multi_turn.enable only
};

}  // namespace rlhfd::roles
