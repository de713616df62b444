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

// algorithm.rollout_correction.bypass_mode: the rollout's log-probs are the old log-probs (the
// ratio's, and the KL reward's), with no forward to recompute them (verl's bypass mode).
inline bool OldLogProbsFromRollout(const v1::JobSpec& spec) {
  return spec.algorithm().rollout_correction().bypass_mode();
}

// algorithm.rollout_correction.rollout_is outside bypass mode: importance weights between the
// old log-probs and the rollout's multiply the policy loss. (In bypass mode the PPO ratio is
// already against the rollout's log-probs, and verl applies none.)
inline bool AppliesRolloutIsWeights(const v1::JobSpec& spec) {
  return !spec.algorithm().rollout_correction().rollout_is().empty() &&
         !OldLogProbsFromRollout(spec);
}

// The old-log-prob forward is needed by an off-policy update's ratio, by a KL mode that
// penalizes the reward (old against reference log-probs) and by the rollout correction's
// weights, unless the rollout's log-probs stand in (bypass mode); otherwise the driver skips it.
inline bool NeedsOldLogProbs(const v1::JobSpec& spec) {
  if (OldLogProbsFromRollout(spec)) return false;
  return !ActorUpdateIsOnPolicy(spec) || KlPenalizesReward(spec.algorithm()) ||
         AppliesRolloutIsWeights(spec);
}

// Whether the update's ratio reads the batch's old log-probs (else it takes its own, detached:
// ActorUpdateIsOnPolicy).
inline bool UpdateReadsOldLogProbs(const v1::JobSpec& spec) {
  return !ActorUpdateIsOnPolicy(spec) || OldLogProbsFromRollout(spec) ||
         AppliesRolloutIsWeights(spec);
}

}  // namespace rlhfd::algorithms
