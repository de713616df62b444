// The advantages of a step, on the actor ranks: token rewards (each response's score on its
// last token, minus the KL penalty when kl.mode is in_reward), then the estimator over the whole
// batch (group statistics and whitening need every row), each rank keeping its own rows.
#pragma once

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "rlhfd/v1/worker_service.pb.h"
#include "worker/roles/step_batch.h"
#include "worker/parallel/communicator.h"

namespace rlhfd::roles {

// Needs scores and response_mask (values for gae; old and ref log-probs for a KL in the reward);
// puts token_rewards, advantages and returns. `replicas` is the actor pool (its all-gather).
// Metrics in verl's names (critic/score/mean, critic/advantages/max, actor/reward_kl_penalty,
// ...), over the whole batch.
absl::StatusOr<v1::AdvantageReply> ComputeAdvantages(const v1::JobSpec& spec,
                                                     const v1::AdvantageRequest& request,
                                                     StepBatch& batch,
                                                     parallel::Communicator& pool);

}  // namespace rlhfd::roles
