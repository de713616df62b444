// The step plan: one RL step over a job's pools in verl's order, as docs/architecture.md's "One
// RL step across processes" lists it — generate, the other pools' forwards, rewards,
// advantages, the updates. Tensors stay on the workers; back come row lengths and metrics.
#pragma once

#include <cstdint>
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

// What a step's stages came to.
struct StepResult {
  // In verl's names (timing_s/<stage> included).
  Metrics metrics;
  // The step's first trainer.log_samples responses, in row order.
  std::vector<v1::ResponseSample> samples;
};

// Runs the stages of `plan`'s step on `pools`. The step's own time is not among the metrics:
// RecordStepTime (step_metrics.h) over whatever span the caller counts as the step.
absl::StatusOr<StepResult> RunStepStages(const PoolCalls& pools, const v1::JobSpec& spec,
                                         const StepPlan& plan, OptimizerSteps& optimizer_steps);

}  // namespace rlhfd::controller
