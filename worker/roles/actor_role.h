// The actor as a hybrid engine: the training layout's weights are the source of truth; a
// rollout runs the generation engine over them (over a gathered copy when the layout shards
// them), and its KV cache and copy are released before the weights train again.
#pragma once

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "rlhfd/v1/worker_service.pb.h"
#include "worker/model/tokenizer.h"
#include "worker/parallel/communicator.h"
#include "worker/parallel/tensor_parallel.h"
#include "worker/roles/hosted_role.h"
#include "worker/roles/response_scorer.h"
#include "worker/roles/step_batch.h"
#include "worker/rollout/engine.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/trained_model.h"

namespace rlhfd::roles {

class ActorRole final : public TrainedRole {
 public:
  // Loads model.path (a causal LM) and its tokenizer on `device`, in the training layout over
  // `pool` (the actor pool, which must outlive the role). `rl_steps` sizes the LR schedule.
  static absl::StatusOr<std::unique_ptr<ActorRole>> Create(const v1::JobSpec& spec,
                                                           const at::Device& device,
                                                           parallel::Communicator& pool,
                                                           int64_t rl_steps);

  // Generates rollout.n responses to each of this rank's prompts, agrees P and R with the pool,
  // and starts `batch` for the step with this rank's rows (`rows` of `total_rows`): input_ids,
  // attention_mask, response_mask, rollout_log_probs, and each row's source.
  absl::StatusOr<v1::GenerateReply> Generate(const v1::GenerateRequest& request, int64_t total_rows,
                                             RowRange rows, StepBatch& batch);
  // old_log_probs: the response log-probs under the weights that sampled, computed as the
  // update computes them.
  absl::Status ComputeOldLogProbs(StepBatch& batch);
  // One PPO update over the step's rows (advantages, and ref_log_probs with a KL loss).
  absl::StatusOr<v1::UpdateReply> Update(const v1::UpdateRequest& request, StepBatch& batch);
  // Generates for validation prompts with rollout.val_kwargs and scores them with `scorer`.
  absl::StatusOr<v1::ValidateReply> Validate(const v1::ValidateRequest& request,
                                             int64_t first_prompt, const ResponseScorer& scorer,
                                             const std::atomic<bool>* cancelled);
  // ReMax's baseline (verl's gen_max): one greedy response to each of the step's prompts,
  // scored with `scorer`; a score per prompt.
  absl::StatusOr<std::vector<double>> GreedyBaseline(const v1::GenerateRequest& request,
                                                     const ResponseScorer& scorer,
                                                     const std::atomic<bool>* cancelled);

  const model::Tokenizer& tokenizer() const { return tokenizer_; }
  train::TrainedModel& trained() override { return *trained_; }
  int64_t optimizer_steps() const override { return optimizer_steps_; }
  void set_optimizer_steps(int64_t steps) override { optimizer_steps_ = steps; }
  int64_t nonfinite_skips() const override { return nonfinite_skips_; }
  void set_nonfinite_skips(int64_t skips) override { nonfinite_skips_ = skips; }
  // Frees the engine's cache and the storage of any copy of the weights.
  void ReleaseRollout();
  void ReleaseDerived() override { ReleaseRollout(); }
  // A module with the full current weights (the training module itself unless the layout
  // shards them), for exports.
  absl::StatusOr<model::Transformer> FullWeights();

 private:
  ActorRole(const v1::JobSpec& spec, const at::Device& device, parallel::Communicator& pool,
            model::Tokenizer tokenizer);
  // The engine over the current weights (a copy gathered or cast when the layout needs one).
  absl::StatusOr<rollout::GenerationEngine*> Engine();
  // A module with the current weights in `dtype`: the training module when it holds them whole
  // in that dtype, else a copy.
  absl::StatusOr<model::Transformer> WeightsIn(at::ScalarType dtype);
  // Generates for `prompts` with `sampling` (seeded per prompt from `seed`) and scores them.
  absl::StatusOr<v1::ValidateReply> GenerateAndScore(
      const google::protobuf::RepeatedPtrField<v1::PromptRow>& prompts, int64_t first_prompt,
      uint64_t seed, const rollout::SamplingParams& sampling, const ResponseScorer& scorer,
      const std::atomic<bool>* cancelled);
  // The engine, or with rollout tp > 1 the tensor-parallel group's generation (every rank of
  // the group calls it together, each with its own requests).
  absl::StatusOr<std::vector<rollout::GenerationResult>> RunEngine(
      const std::vector<rollout::GenerationRequest>& requests);
  absl::StatusOr<std::vector<rollout::GenerationResult>> RunTensorParallel(
      const std::vector<rollout::GenerationRequest>& requests);
  // Frees the copy's storage.
  void ReleaseCopy();
  // The longest prompt and response over the pool, in place.
  absl::Status ReduceLongest(std::vector<double>& longest);

  v1::JobSpec spec_;
  at::Device device_;
  parallel::Communicator& pool_;
  model::Tokenizer tokenizer_;
  std::unique_ptr<train::TrainedModel> trained_;
  std::optional<train::LrSchedule> schedule_;
  int64_t optimizer_steps_ = 0;
  int64_t nonfinite_skips_ = 0;
  // A copy of the weights for the rollout (or an export) when the training module cannot serve:
  // its module lives on, its storage only while in use.
  std::optional<model::Transformer> copy_;
  at::ScalarType copy_dtype_ = at::kFloat;
  std::vector<std::pair<std::vector<int64_t>, at::ScalarType>> copy_shapes_;
  bool copy_held_ = false;
  std::unique_ptr<rollout::GenerationEngine> engine_;
  // rollout tp > 1: this rank's tensor-parallel group within the pool, and the slices' model
  // while a rollout runs.
  std::unique_ptr<parallel::Communicator> tp_group_;
  std::optional<parallel::TensorParallelTransformer> tensor_parallel_;
  // Seconds the last Engine() took to bring the rollout's weights up to date (verl's
  // timing_s/update_weights).
  double weights_update_s_ = 0;
};

}  // namespace rlhfd::roles
