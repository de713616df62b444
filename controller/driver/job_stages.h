// A job's stages over its workers, as the driver runs them: start (rendezvous through rank 0's
// bootstrap), one RL step (the step plan, rl_step.h), validation, checkpoints, dumps and the
// end. Each stage fans out to its pool's ranks at once and waits for all of them (PoolCalls);
// tensors stay on the workers. No LibTorch: the controller's driver uses it, tests drive it
// against in-process or real workers.
//
// Blocking: call it from a thread of its own, never from an event loop.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/stages/stage_service.h"
#include "controller/driver/async_rollout.h"
#include "controller/driver/pool_calls.h"
#include "controller/driver/rl_step.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "rlhfd/v1/worker_service.pb.h"

namespace rlhfd::controller {

struct ValidationResult {
  std::vector<double> scores;  // per response, prompt-major
  std::vector<std::string> responses;
  Metrics metrics;  // val/score/mean, val/response_length/mean, val/score/<rule>/mean
  std::vector<v1::ResponseSample> samples;  // the first trainer.log_samples responses
};

class JobStages {
 public:
  // `ranks[r]` serves world rank r and outlives this object.
  JobStages(std::string job_id, v1::JobSpec spec, std::vector<stages::StageService*> ranks,
            JobStagesOptions options = {});

  // PrepareJob on rank 0, then StartJob on every rank at once. `total_steps` sizes the
  // learning-rate schedules.
  absl::Status Start(int64_t total_steps);
  // One RL step, timed alone (timing_s/step is the step's stages): for tests and benchmarks.
  absl::StatusOr<Metrics> RunStep(const StepPlan& plan, const StepPlan* next = nullptr);
  // One RL step's stages without the step's own time, for a caller that times a wider span
  // (the driver's step includes validation and the checkpoint) with RecordStepTime. With
  // trainer.mode one_step_off, `next` (null for the last step) is the next step's plan: its
  // rollout is generated before this step trains and kept for the next call.
  absl::StatusOr<StepResult> RunStepStages(const StepPlan& plan, const StepPlan* next = nullptr);
  // trainer.mode async: from now on the rollout pool generates the batches of steps
  // `first`..`last` (`plan_of` gives each step's plan) on a thread of its own (AsyncRollout), and
  // each RunStepStages takes its step's. Call after Start and any LoadCheckpoint.
  void StartAsyncRollout(std::function<StepPlan(int64_t step)> plan_of, int64_t first,
                         int64_t last);
  // Generates for `prompts` with rollout.val_kwargs and scores them; `step` keys the call.
  absl::StatusOr<ValidationResult> Validate(int64_t step, const std::vector<v1::PromptRow>& prompts,
                                            uint64_t seed);
  // Every rank but the rollout pool's (it keeps no state) saves step `step` in
  // trainer.checkpoint_dir (the only directory a worker saves to
  // or loads from), then rank 0 commits it (commit record, `latest`, retention). `kl_coef` (the
  // driver's adaptive KL coefficient) is kept with it. RESOURCE_EXHAUSTED: a rank's disk or quota
  // is full; nothing was committed.
  absl::Status SaveCheckpoint(int64_t step, bool export_huggingface, double kl_coef = 0);
  // trainer.async_save: every rank copies its state of step `step` to host memory and starts
  // writing it on a thread of its own; returns once every copy is made. `commit_step` (0: none),
  // a step whose background save every rank has finished, is committed first by rank 0's thread.
  absl::Status StartBackgroundSave(int64_t step, double kl_coef, int64_t commit_step);
  // The background save in flight, if any: every rank waits until its thread is done: the files
  // durable (and on rank 0 the commit it carried made). Returns the step written (0: none was in
  // flight); it is not committed. However it ends, no save is in flight after it.
  // RESOURCE_EXHAUSTED: a rank's disk or quota is full.
  absl::StatusOr<int64_t> FinishBackgroundSave();
  // Rank 0 commits `step`, which every rank has saved (commit record, `latest`, retention).
  absl::Status Commit(int64_t step);
  // Every rank loads the newest committed step at or below `step` (0: of all) in
  // trainer.checkpoint_dir whose files pass every rank's checks; returns the step loaded.
  // NOT_FOUND: no checkpoint; DATA_LOSS: none is intact (naming the bad files). Newer steps
  // passed over are in passed_over().
  absl::StatusOr<int64_t> LoadCheckpoint(int64_t step);
  // Every rank holding rows of `step` (the rollout pool's aside: its rows moved to the actor's)
  // writes them under trainer.rollout_data_dir; the paths.
  absl::StatusOr<std::vector<std::string>> DumpBatch(int64_t step);
  // The length in tokens of each of `prompts` (chat template applied, untruncated), measured by
  // rank 0 in chunks; needs no Start.
  absl::StatusOr<std::vector<int64_t>> MeasurePrompts(const std::vector<v1::PromptRow>& prompts);
  // EndJob on every rank within `deadline` (errors are logged, not returned: a rank may be gone
  // or hung).
  void End(absl::Duration deadline = absl::Seconds(20));

  const std::vector<v1::PoolAssignment>& pools() const { return calls_.pools(); }
  int world_size() const { return calls_.world_size(); }
  int64_t actor_optimizer_steps() const { return optimizer_steps_.actor; }
  // The kl_coef the loaded checkpoint was saved with.
  double loaded_kl_coef() const { return loaded_kl_coef_; }
  // The world ranks that had not answered when a stage ran past its deadline, the last time one
  // did (PoolCalls::unanswered).
  std::vector<int> unanswered_ranks() const { return calls_.unanswered(); }
  // What the last LoadCheckpoint passed over: "step <N>: <file>: <what is wrong>", each once.
  const std::vector<std::string>& passed_over() const { return passed_over_; }

 private:
  // A CheckpointRequest for `step` keyed by `stage`, in trainer.checkpoint_dir.
  v1::CheckpointRequest CheckpointCall(int64_t step, const char* stage);
  absl::Status SaveOnEveryRank(const v1::CheckpointRequest& request);
  // One round of LoadCheckpoint: every rank loads the newest intact step at or below `want`.
  absl::StatusOr<std::vector<v1::CheckpointReply>> LoadRound(int64_t want);

  v1::JobSpec spec_;
  PoolCalls calls_;
  OptimizerSteps optimizer_steps_;
  // one_step_off: the rollout the last step made for the next one (dropped by a failed step or
  // a checkpoint load: that step then generates its own).
  std::optional<StepRollout> ahead_;
  // trainer.mode async: the rollout pool's thread (after calls_: stopped before it goes).
  std::unique_ptr<AsyncRollout> async_;
  double loaded_kl_coef_ = 0;
  int64_t background_save_ = 0;  // the step of the background save in flight (0: none)
  std::vector<std::string> passed_over_;
};

}  // namespace rlhfd::controller
