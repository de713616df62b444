// A job's bootstrap on one worker: PrepareJob's rendezvous on rank 0 (an NCCL id, or a socket
// listener, and the job's secret) and StartJob's layout, communicators and roles. RoleHost keeps
// the tables of prepared and running jobs and calls these on its executor.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "rlhfd/v1/worker_service.pb.h"
#include "worker/roles/hosted_job.h"
#include "worker/roles/role_host.h"

namespace rlhfd::roles {

// A new rendezvous for `request`'s attempt: an NCCL unique id when it asks for NCCL (a worker
// built without CUDA refuses), else a socket listener bound on options.host; and a fresh secret.
absl::StatusOr<std::unique_ptr<PreparedJob>> PrepareRendezvous(
    const v1::PrepareJobRequest& request, const RoleHostOptions& options,
    std::chrono::steady_clock::time_point arrived);

// Starts `request`'s attempt on this rank: the layout, the world communicator (rank 0 of a
// socket world takes its listener out of `prepared`, which PrepareJob filled), a communicator
// per pool, and the roles this rank hosts. The job's rendezvous leaves `prepared` once the world
// is connected. `started` of the job returned lists its roles.
absl::StatusOr<std::unique_ptr<HostedJob>> StartHostedJob(
    const v1::StartJobRequest& request, const RoleHostOptions& options,
    std::shared_ptr<std::atomic<bool>> cancelled, std::chrono::steady_clock::time_point arrived,
    std::map<std::string, std::unique_ptr<PreparedJob>>& prepared);

}  // namespace rlhfd::roles
