// What trainer.mode sft's validation is. The validator (whether a reward is needed), the
// controller (what the validation files hold, which metrics it reports) and the actor (whether it
// generates or takes the loss) read the same rule.
#pragma once

#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::algorithms {

// trainer.mode sft without a reward: validation is verl's SFT trainer's, the loss on the
// validation files' conversations (val/loss: the negative log-likelihood of their assistant
// tokens, token-mean). With a reward (rule, model, service or function), an SFT job validates as
// an RL job does: responses generated from the validation prompts, scored.
inline bool ValidatesByLoss(const v1::JobSpec& spec) {
  const v1::RewardSpec& reward = spec.roles().reward();
  return spec.trainer().mode() == v1::TRAINER_MODE_SFT && reward.rule().empty() &&
         reward.model().empty() && reward.remote().empty() && !reward.has_custom_reward_function();
}

}  // namespace rlhfd::algorithms
