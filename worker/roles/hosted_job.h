// A job as one worker hosts it (its layout, communicators, roles and the step's rows), the
// rendezvous rank 0 holds between PrepareJob and StartJob, and the checks every stage shares.
// RoleHost owns these on its executor; the stage files (job_bootstrap, batch_stages,
// checkpoint_stages) work on them.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "rlhfd/v1/worker_service.pb.h"
#include "worker/parallel/communicator.h"
#include "worker/parallel/socket_communicator.h"
#include "worker/roles/actor_role.h"
#include "worker/roles/background_save.h"
#include "worker/roles/checkpoint_mirror.h"
#include "worker/roles/critic_role.h"
#include "worker/roles/frozen_roles.h"
#include "worker/roles/job_layout.h"
#include "worker/roles/pool_weight_sync.h"
#include "worker/roles/response_scorer.h"
#include "worker/roles/rollout_role.h"
#include "worker/roles/step_batch.h"

namespace rlhfd::roles {

// Rank 0's rendezvous, between PrepareJob and StartJob.
struct PreparedJob {
  int64_t attempt = 0;
  std::chrono::steady_clock::time_point arrived;  // when PrepareJob reached this worker
  std::unique_ptr<parallel::RendezvousListener> listener;
  v1::Bootstrap bootstrap;
};

// A job as this worker hosts it.
struct HostedJob {
  std::string id;
  int64_t attempt = 0;
  std::chrono::steady_clock::time_point arrived;  // when StartJob reached this worker
  v1::JobSpec spec;
  std::unique_ptr<JobLayout> layout;
  std::unique_ptr<parallel::Communicator> world;
  std::map<v1::Role, std::unique_ptr<parallel::Communicator>> pools;  // role → its pool's
  std::unique_ptr<ActorRole> actor;
  std::unique_ptr<CriticRole> critic;
  std::unique_ptr<ReferenceRole> reference;
  std::unique_ptr<RewardModelRole> reward_model;
  std::unique_ptr<RolloutRole> rollout;  // roles.rollout: a rank that only generates
  // roles.rollout: the actor ranks (first) and the rollout ranks, which the actor's weights
  // cross to reach the rollout pool, and the transfer over it (on ranks of either pool).
  std::unique_ptr<parallel::Communicator> weights_group;
  std::unique_ptr<PoolWeightSync> weights_sync;
  RolloutWeightsHook rollout_weights_hook;  // tests: corrupts the received weights
  std::unique_ptr<ResponseScorer> scorer;  // rule / remote rewards, on the actor ranks
  // The rows of the steps under way, by step: with trainer.mode one_step_off, step s + 1's
  // rollout begins before step s trains; async, a rollout rank holds up to max_staleness + 1.
  std::map<int64_t, StepBatch> batches;
  v1::StartJobReply started;
  // Successful replies by key, serialized; the last two steps' are kept.
  std::map<std::pair<int64_t, std::string>, std::string> replies;
  // Set when an update failed midway: the weights are in doubt until a checkpoint loads.
  std::string poisoned;
  // trainer.async_save: this rank's save in flight, until the driver finishes it.
  std::unique_ptr<BackgroundSave> background_save;
  // trainer.checkpoint_uri: the bucket the checkpoints are copied to; null without one. Shared
  // with the background save's thread.
  std::shared_ptr<CheckpointMirror> checkpoint_mirror;
  std::shared_ptr<std::atomic<bool>> cancelled;

  // `role` as this rank hosts it, or null.
  HostedRole* Role(v1::Role role);
  // The trained roles this rank hosts, actor first.
  std::vector<std::pair<v1::Role, TrainedRole*>> TrainedRoles();
  // The rows this rank holds of `step` (none begun when it holds none yet). Earlier steps are
  // dropped (with trainer.mode one_step_off, those before step - 1; async, before step -
  // max_staleness): no stage goes back to them.
  StepBatch& BatchOf(int64_t step);
  // The communicator of `role`'s pool (this rank must be in it).
  parallel::Communicator& PoolOf(v1::Role role) { return *pools.at(role); }
};

// INVALID_ARGUMENT unless `attempt` >= 1: every call names its job's attempt, so a call cannot
// reach whichever attempt runs.
absl::Status CheckAttempt(int64_t attempt);
// FAILED_PRECONDITION naming this rank when it does not host `role` (`hosted` false).
absl::Status NeedRole(const HostedJob& job, v1::Role role, bool hosted);
// FAILED_PRECONDITION unless this rank holds rows of `step` (generated here, or moved here):
// `stage` runs on them.
absl::Status NeedStepRows(const StepBatch& batch, int64_t step, absl::string_view stage);
// The directory a stage request names must be the one the job's config gave under `key`: no
// request makes a worker write, read or probe a path anywhere else (no other absolute path, no
// ".."). FAILED_PRECONDITION when the config gives none, PERMISSION_DENIED for another path.
absl::Status CheckConfiguredDirectory(const std::string& requested, const std::string& configured,
                                      absl::string_view key);

}  // namespace rlhfd::roles
