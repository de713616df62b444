// The stages over a step's rows, each on the hosted job it is given (RoleHost runs them on its
// executor with the stored-reply and poisoned-job rules): generation, moves between pools,
// forwards, rewards, advantages, updates, validation and the rollout-data dump.
#pragma once

#include <ATen/Device.h>

#include "absl/status/statusor.h"
#include "rlhfd/v1/worker_service.pb.h"
#include "worker/roles/hosted_job.h"

namespace rlhfd::roles {

// The rollout of this rank's prompts, on the actor's ranks (with ReMax, also the greedy
// baseline's rewards) or a rollout pool's; an actor rank of a job with a rollout pool records
// its rows' sources once they moved here (rows_from_rollout_pool). A rollout rank's partial
// rollout stops once `queued_pool_calls` is above 0 (RolloutRole::Generate).
absl::StatusOr<v1::GenerateReply> RunGenerate(HostedJob& job, const v1::GenerateRequest& request,
                                              const at::Device& device,
                                              const std::atomic<int64_t>* queued_pool_calls);
// roles.rollout: the actor's weights to the rollout pool (pool_weight_sync.h), on every rank of
// both pools.
absl::StatusOr<v1::SyncWeightsReply> RunSyncWeights(HostedJob& job,
                                                    const v1::SyncWeightsRequest& request);
// Sends the named tensors from one pool's ranks to another's; a receiving rank that holds
// nothing of the step yet begins it with the request's shape.
absl::StatusOr<v1::MoveTensorsReply> RunMoveTensors(HostedJob& job,
                                                    const v1::MoveTensorsRequest& request,
                                                    const at::Device& device);
absl::StatusOr<v1::ForwardReply> RunForward(HostedJob& job, const v1::ForwardRequest& request);
// Rule or remote rewards of the step's responses, on the actor ranks.
absl::StatusOr<v1::RewardReply> RunRewards(HostedJob& job, const v1::RewardRequest& request);
absl::StatusOr<v1::AdvantageReply> RunAdvantages(HostedJob& job,
                                                 const v1::AdvantageRequest& request);
absl::StatusOr<v1::UpdateReply> RunUpdateActor(HostedJob& job, const v1::UpdateRequest& request);
absl::StatusOr<v1::UpdateReply> RunUpdateCritic(HostedJob& job, const v1::UpdateRequest& request);
absl::StatusOr<v1::ValidateReply> RunValidate(HostedJob& job, const v1::ValidateRequest& request);
// This rank's tensors of the step, to <trainer.rollout_data_dir>/step_<N>_rank_<r>.safetensors.
absl::StatusOr<v1::DumpBatchReply> RunDumpBatch(HostedJob& job,
                                                const v1::DumpBatchRequest& request);

}  // namespace rlhfd::roles
