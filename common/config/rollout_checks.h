// The checks of the rollout's settings: roles.actor.rollout (sampling, the engine's limits,
// tensor parallelism, multi-turn) and a rollout pool of its own (roles.rollout).
#pragma once

#include "common/config/config_checker.h"
#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::config {

void CheckRollout(Checker& check, const v1::JobSpec& spec);

}  // namespace rlhfd::config
