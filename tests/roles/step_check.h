// What the stage tests share: the PPO and GRPO test jobs, their prompts, and the check that a
// job's steps through a set of stage services (in-process hosts or worker processes) equal one
// process computing them with the engine functions.
#pragma once

#include <ATen/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "common/stages/stage_service.h"
#include "controller/driver/job_stages.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "tests/support/rl_reference.h"

namespace rlhfd::roles::testing {

// PPO with GAE, the KL in the reward and a reward model, split over 5 ranks (actor dp 2, critic,
// reference, reward model); and GRPO with n = 4 and a KL loss over 4 (actor dp 2, reference,
// reward model).
extern const char kPpoJob[];
extern const char kGrpoJob[];

// A job from one of the texts above (fixture paths filled in) with `overrides`.
v1::JobSpec TestSpec(const char* text, const std::vector<std::string>& overrides = {});
std::vector<v1::PromptRow> TestPrompts(int count);

// The KL coefficient a step of `spec` is given.
double StepKlCoefficient(const v1::JobSpec& spec);

// The actor ranks' dumps of `step` (in the job's trainer.rollout_data_dir), merged in row order.
rlhfd::testing::StepTensors Dumped(controller::JobStages& job, int64_t step);

// A role's parameters as it saved them at `step` (every layout: SavedWeights), for a model of
// `like`'s architecture.
std::map<std::string, at::Tensor> SavedParameters(const std::string& directory, int64_t step,
                                                  const std::string& role,
                                                  model::Transformer& like);

// Starts the job on `services`, runs `steps` steps, and after each compares with one process:
// greedy responses identical to one engine's, every intermediate within 1e-5, the weights
// within 1e-5 and their updates within 0.1% of the update's norm.
void CheckAgainstOneProcess(const v1::JobSpec& spec,
                            const std::vector<stages::StageService*>& services, int prompts,
                            int steps);

}  // namespace rlhfd::roles::testing
