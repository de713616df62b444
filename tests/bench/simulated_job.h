// The job the control-plane benchmarks run over simulated workers: PPO with GAE split over the
// pools of the study this project starts from, in proportion (actor 1/2 of the workers, critic
// 1/4, reference and reward model 1/8 each).
#pragma once

#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::bench {

inline v1::JobSpec SimulatedPpoJob(const char* name, int workers) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.set_placement(v1::PLACEMENT_SPLIT);
  spec.mutable_algorithm()->set_adv_estimator(v1::ADVANTAGE_ESTIMATOR_GAE);
  v1::RolesSpec& roles = *spec.mutable_roles();
  roles.mutable_actor()->set_gpus(workers / 2);
  roles.mutable_actor()->mutable_rollout()->set_n(1);
  roles.mutable_critic()->set_gpus(workers / 4);
  roles.mutable_reference()->set_gpus(workers / 8);
  roles.mutable_reward()->set_model("/simulated/reward-model");
  roles.mutable_reward()->set_gpus(workers - workers / 2 - workers / 4 - workers / 8);
  return spec;
}

}  // namespace rlhfd::bench
