// The step plan: one RL step over a job's pools in verl's order, as docs/architecture.md's "One
// RL step across processes" lists it — generate, the other pools' forwards, rewards,
// advantages, the updates. Tensors stay on the workers; back come row lengths and metrics.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/driver/pool_calls.h"
#include "rlhfd/v1/job_service.pb.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "rlhfd/v1/worker_service.pb.h"

namespace rlhfd::controller {

// One step's batch.
struct StepPlan {
  int64_t step = 1;
  std::vector<v1::PromptRow> prompts;
  uint64_t seed = 1;
  double kl_coef = 0;  // the KL coefficient in the reward (the driver's controller keeps it)
};

// The optimizer steps each trained pool has taken, which its next update names (so a repeated
// update call is recognised); a loaded checkpoint sets them.
struct OptimizerSteps {
  int64_t actor = 0;
  int64_t critic = 0;
};

// A step's rollout: the Generate replies of the ranks that made it (the actor's, or the rollout
// pool's).
struct StepRollout {
  int64_t step = 0;
  // The last step whose update the weights it was generated with include (0: the initial ones).
  int64_t weights_step = 0;
  std::vector<v1::GenerateReply> replies;
  double seconds = 0;
  // roles.rollout: whether its rows are on the actor ranks already (AdoptPoolRollout), and what
  // getting them there took (timing_s/adopt_rollout, perf/moved_bytes; async's
  // timing_s/wait_rollout).
  bool adopted = false;
  Metrics metrics;
};

// What a step's stages came to.
struct StepResult {
  // In verl's names (timing_s/<stage> included).
  Metrics metrics;
  // The step's first trainer.log_samples responses, in row order.
  std::vector<v1::ResponseSample> samples;
  // trainer.mode one_step_off: the next step's rollout, generated before this step trained.
  std::optional<StepRollout> next_rollout;
};

// How a step runs its rollout (trainer.mode).
struct RolloutSchedule {
  // This step's rollout, made by the previous step's run (one_step_off) or the async rollout's
  // thread (async_rollout.h); none: generate it now.
  std::optional<StepRollout> ahead;
  // one_step_off: the next step, whose rollout is generated with the weights this step starts
  // from, before this step trains; null on the last step, or in sync mode.
  const StepPlan* next = nullptr;
  // Whether the next step's rollout runs while this step's other stages do (a rollout placed
  // apart from the pools that train), or first, awaited (the hybrid engine: the actor's ranks
  // generate and train in turn, and two stage calls of different steps must reach every rank in
  // the same order). JobStages sets it when the job has a rollout pool of its own.
  bool overlap = false;
};

// roles.rollout: what sending the actor's current weights to the rollout pool took, by rollout
// rank (none without a rollout pool).
struct RolloutWeights {
  std::vector<v1::SyncWeightsReply> replies;
  double seconds = 0;
};
// Sends the actor's current weights, those after step `weights_step`'s update, to the rollout
// pool (every rank of both pools), keyed by `step`; nothing without a rollout pool.
absl::StatusOr<RolloutWeights> SyncRolloutWeights(const PoolCalls& pools, int64_t step,
                                                  int64_t weights_step);
// Generates `plan`'s rollout on the actor ranks, or the rollout pool's when the job has one, with
// the weights after step `weights_step`. trainer.mode async with partial rollouts: while the
// pool replies that responses are unfinished (a weight update or a move of rows out of the pool
// interrupted them), `before_resume` runs (it waits for those calls), then the pool goes on.
absl::StatusOr<StepRollout> GenerateRollout(const PoolCalls& pools, const v1::JobSpec& spec,
                                            const StepPlan& plan, int64_t weights_step,
                                            const std::function<void()>& before_resume = {});
// The rollout pool's weights, sent before `rollout`, as a part of generating it, as the hybrid
// engine's update is (verl's timing_s/update_weights), with their check.
void AddRolloutWeights(const RolloutWeights& weights, StepRollout& rollout);
// roles.rollout: `rollout`'s rows moved from the rollout pool to the actor ranks, which record
// their sources; marks it adopted.
absl::Status AdoptPoolRollout(const PoolCalls& pools, const v1::JobSpec& spec, const StepPlan& plan,
                              StepRollout& rollout);

// A step that failed in the next step's rollout (one_step_off) says so: that step's number, for
// naming its bad prompt by its own rows.
absl::Status WithFailedRollout(absl::Status status, int64_t step);
std::optional<int64_t> FailedRolloutStep(const absl::Status& status);

// Runs the stages of `plan`'s step on `pools`. The step's own time is not among the metrics:
// RecordStepTime (step_metrics.h) over whatever span the caller counts as the step.
absl::StatusOr<StepResult> RunStepStages(const PoolCalls& pools, const v1::JobSpec& spec,
                                         const StepPlan& plan, OptimizerSteps& optimizer_steps,
                                         RolloutSchedule schedule = {});

}  // namespace rlhfd::controller
