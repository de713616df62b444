#include "worker/roles/job_bootstrap.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging/logging.h"
#include "common/status/status_macros.h"
#include "worker/device/device_memory.h"
#include "worker/parallel/host_staged_communicator.h"
#include "worker/parallel/socket_communicator.h"
#include "worker/rollout/device_support.h"
#ifdef RLHFD_HAVE_CUDA
#include "worker/parallel/nccl_communicator.h"
#endif

namespace rlhfd::roles {
namespace {

std::string RandomSecret() {
  std::random_device device;
  std::string secret(parallel::kSocketSecretBytes, '\0');
  for (char& c : secret) c = static_cast<char>(device() & 0xFF);
  return secret;
}

// The job's world: NCCL when the bootstrap carries an id, else sockets through rank 0's listener
// (on a GPU worker, with device tensors staged through host memory: workers sharing a GPU).
absl::StatusOr<std::unique_ptr<parallel::Communicator>> ConnectWorld(
    const v1::StartJobRequest& request, const RoleHostOptions& options,
    const std::shared_ptr<std::atomic<bool>>& cancelled,
    std::map<std::string, std::unique_ptr<PreparedJob>>& prepared_jobs) {
  const auto timeout = request.communicator_timeout_ms() > 0
                           ? std::chrono::milliseconds(request.communicator_timeout_ms())
                           : options.collective_timeout;
  const v1::Bootstrap& bootstrap = request.bootstrap();
  if (!bootstrap.nccl_unique_id().empty()) {
#ifdef RLHFD_HAVE_CUDA
    return parallel::CreateNcclCommunicator(request.rank(), request.world_size(),
                                            bootstrap.nccl_unique_id(), options.device,
                                            {.timeout = timeout, .interrupt = cancelled});
#else
    return absl::FailedPreconditionError("this worker was built without CUDA (no NCCL)");
#endif
  }
  if (bootstrap.socket_master().empty() && request.world_size() > 1) {
    return absl::InvalidArgumentError(
        "StartJob: bootstrap has neither a socket master nor "
        "an NCCL id (PrepareJob on rank 0 makes one)");
  }
  parallel::SocketOptions socket{
      .master = bootstrap.socket_master().empty() ? "127.0.0.1:1" : bootstrap.socket_master(),
      .timeout = timeout,
      .secret = bootstrap.secret(),
      .interrupt = cancelled};
  std::unique_ptr<PreparedJob> prepared;
  if (request.rank() == 0 && request.world_size() > 1) {
    auto found = prepared_jobs.find(request.job_id());
    if (found == prepared_jobs.end() || !found->second->listener) {
      return absl::FailedPreconditionError(
          "StartJob on rank 0: PrepareJob was not called on this worker for the job");
    }
    prepared = std::move(found->second);
    prepared_jobs.erase(found);
    socket.listener = prepared->listener.get();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> world,
                   parallel::CreateSocketCommunicator(request.rank(), request.world_size(), socket));
  if (options.device.is_cuda()) return parallel::StageThroughHost(std::move(world));
  return world;
}

// The roles this rank hosts, each over its pool's communicator. What each role's creation adds to
// the device's memory in use is logged (a LoRA actor's reference adds none of the weights).
absl::Status CreateRoles(HostedJob& job, int64_t total_steps, const RoleHostOptions& options) {
  const at::Device& device = options.device;
  const int64_t rl_steps = std::max<int64_t>(1, total_steps);
  const v1::JobSpec& spec = job.spec;
  int64_t in_use = worker::BytesInUse(device);
  const auto log_memory = [&](const char* role, absl::string_view note) {
    const int64_t now = worker::BytesInUse(device);
    RLOG(INFO) << "the " << role << " holds "
               << absl::StrFormat("%.3f", static_cast<double>(now - in_use) / (1 << 20)) << " MiB"
               << note;
    in_use = now;
  };
  if (job.layout->Hosts(v1::ROLE_ACTOR)) {
    ASSIGN_OR_RETURN(job.actor,
                     ActorRole::Create(spec, device, *job.layout, job.PoolOf(v1::ROLE_ACTOR),
                                       rl_steps, options.rollout_weights_hook));
    ASSIGN_OR_RETURN(job.scorer, ResponseScorer::Create(spec.roles().reward()));
    log_memory("actor", job.actor->lora() ? " (a frozen base and LoRA adapters)" : "");
  }
  if (job.layout->Hosts(v1::ROLE_CRITIC)) {
    ASSIGN_OR_RETURN(job.critic,
                     CriticRole::Create(spec, device, job.PoolOf(v1::ROLE_CRITIC), rl_steps));
    log_memory("critic", "");
  }
  if (job.layout->Hosts(v1::ROLE_REFERENCE)) {
    // A LoRA actor hosted here lends its base (adapters off) rather than a second copy.
    ASSIGN_OR_RETURN(job.reference, ReferenceRole::Create(
                                        spec, device, job.actor ? job.actor->LoraBase() : nullptr));
    log_memory("reference",
               job.reference->shares_actor() ? " (the LoRA actor's base, adapters off)" : "");
  }
  if (job.layout->Hosts(v1::ROLE_ROLLOUT)) {
    parallel::Communicator& pool = job.PoolOf(v1::ROLE_ROLLOUT);
    ASSIGN_OR_RETURN(const int64_t ranks_on_device, rollout::RanksOnThisDevice(pool, device));
    ASSIGN_OR_RETURN(job.rollout,
                     RolloutRole::Create(spec, device, *job.layout, pool, ranks_on_device,
                                         options.fault_hold_rollout_decode_step));
    log_memory("rollout", " (generation only: weights from the actor ranks)");
  }
  if (job.layout->Hosts(v1::ROLE_REWARD)) {
    if (spec.roles().reward().model().empty()) {
      return absl::InvalidArgumentError(
          "pools: a reward pool needs roles.reward.model (rule and remote rewards run on the "
          "actor ranks)");
    }
    ASSIGN_OR_RETURN(job.reward_model, RewardModelRole::Create(spec, device));
    log_memory("reward model", "");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PreparedJob>> PrepareRendezvous(
    const v1::PrepareJobRequest& request, const RoleHostOptions& options,
    std::chrono::steady_clock::time_point arrived) {
  auto prepared = std::make_unique<PreparedJob>();
  prepared->attempt = request.attempt();
  prepared->arrived = arrived;
  if (request.nccl()) {
#ifdef RLHFD_HAVE_CUDA
    ASSIGN_OR_RETURN(std::string id, parallel::NewNcclUniqueId());
    prepared->bootstrap.set_nccl_unique_id(id);
#else
    return absl::FailedPreconditionError("this worker was built without CUDA (no NCCL)");
#endif
  } else {
    ASSIGN_OR_RETURN(parallel::RendezvousListener listener,
                     parallel::RendezvousListener::Bind(options.host));
    prepared->bootstrap.set_socket_master(listener.address());
    prepared->listener = std::make_unique<parallel::RendezvousListener>(std::move(listener));
  }
  prepared->bootstrap.set_secret(RandomSecret());
  return prepared;
}

absl::StatusOr<std::unique_ptr<HostedJob>> StartHostedJob(
    const v1::StartJobRequest& request, const RoleHostOptions& options,
    std::shared_ptr<std::atomic<bool>> cancelled, std::chrono::steady_clock::time_point arrived,
    std::map<std::string, std::unique_ptr<PreparedJob>>& prepared) {
  if (request.job_id().empty()) {
    return absl::InvalidArgumentError("StartJob: job_id is required");
  }
  cancelled->store(false);
  auto job = std::make_unique<HostedJob>();
  job->id = request.job_id();
  job->attempt = request.attempt();
  job->arrived = arrived;
  job->spec = request.spec();
  job->cancelled = cancelled;
  if (const std::string& uri = job->spec.trainer().checkpoint_uri(); !uri.empty()) {
    ASSIGN_OR_RETURN(job->checkpoint_mirror,
                     CheckpointMirror::Open(uri, cancelled, options.fault_hold_checkpoint_upload));
  }
  ASSIGN_OR_RETURN(JobLayout layout,
                   JobLayout::Create(request.world_size(), request.rank(), request.pools()));
  job->layout = std::make_unique<JobLayout>(std::move(layout));
  ASSIGN_OR_RETURN(job->world, ConnectWorld(request, options, cancelled, prepared));
  prepared.erase(request.job_id());
  // A communicator per pool, split from the world in the same order on every rank.
  for (const RolePool& pool : job->layout->pools()) {
    const int position = job->layout->PositionIn(pool.role);
    ASSIGN_OR_RETURN(std::unique_ptr<parallel::Communicator> split,
                     job->world->Split(position >= 0 ? 0 : -1, position));
    if (split) job->pools[pool.role] = std::move(split);
  }
  // A rollout pool of its own: the actor's ranks and the rollout's share a communicator for the
  // weights, the actor's first (split on every rank, in the same order).
  if (job->layout->Find(v1::ROLE_ROLLOUT) != nullptr) {
    const int actors = static_cast<int>(job->layout->Find(v1::ROLE_ACTOR)->ranks.size());
    const int in_actor = job->layout->PositionIn(v1::ROLE_ACTOR);
    const int in_rollout = job->layout->PositionIn(v1::ROLE_ROLLOUT);
    const int key = in_actor >= 0 ? in_actor : in_rollout >= 0 ? actors + in_rollout : -1;
    ASSIGN_OR_RETURN(job->weights_group, job->world->Split(key >= 0 ? 0 : -1, key));
    if (job->weights_group) {
      job->weights_sync = std::make_unique<PoolWeightSync>(
          *job->weights_group, actors, job->spec.roles().actor().rollout().tp(), options.device,
          UpdateBucketBytes(job->spec));
    }
  }
  job->rollout_weights_hook = options.rollout_weights_hook;
  RETURN_IF_ERROR(CreateRoles(*job, request.total_steps(), options));
  for (const v1::Role role : job->layout->HostedRoles()) job->started.add_roles(role);
  return job;
}

}  // namespace rlhfd::roles
