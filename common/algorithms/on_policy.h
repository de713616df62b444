// Whether a job's actor update is on-policy, which decides if the old-log-prob forward runs. The
// driver (which schedules the stage) and the actor (which takes the ratio) read the same rule.
#pragma once

#include "common/algorithms/algorithm_traits.h"
#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::algorithms {

// One PPO epoch over a single mini-batch of the whole step (ppo_epochs 1, ppo_mini_batch_size =
// data.train_batch_size): the update starts from the very weights that sampled the batch, so the
// old log-probs equal the update's own. As verl's actor, the ratio is then taken against the
// update's log-probs, detached (ratio 1, no clipping; the gradient is the policy gradient).
inline bool ActorUpdateIsOnPolicy(const v1::JobSpec& spec) {
  const v1::TrainSpec& train = spec.roles().actor().train();
  return train.ppo_epochs() == 1 && train.ppo_mini_batch_size() == spec.data().train_batch_size();
}

// The old-log-prob forward is needed by an off-policy update's ratio and by a KL mode that
// penalizes the reward (old against reference log-probs); otherwise the driver skips it.
inline bool NeedsOldLogProbs(const v1::JobSpec& spec) {
  return !ActorUpdateIsOnPolicy(spec) || KlPenalizesReward(spec.algorithm());
}

}  // namespace rlhfd::algorithms
