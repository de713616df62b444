// RoleHost: one worker's jobs and the roles it hosts for them, behind the StageService interface
// (in process; worker/service adapts it to gRPC). One executor thread owns the device and every
// job's state: calls are posted to it and answered from it, so callers never block and stages
// never race. A stage call repeated with the same (job, step, stage) key gets the first call's
// stored reply; an update that failed leaves its job refusing stages until a checkpoint loads.
// RoleHost keeps that bookkeeping; what each stage does lives by concern in job_bootstrap.h,
// batch_stages.h and checkpoint_stages.h, over the HostedJob of hosted_job.h.
#pragma once

#include <ATen/Device.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/stages/stage_service.h"
#include "common/util/event_loop.h"
#include "worker/roles/hybrid_engine.h"
#include "worker/roles/prompt_encoding.h"

namespace rlhfd::roles {

struct HostedJob;
struct PreparedJob;

struct RoleHostOptions {
  at::Device device = at::kCPU;
  // The address other workers reach this one at (IPv4): the host of a socket rendezvous.
  std::string host = "127.0.0.1";
  // Rendezvous and collective deadline when StartJob gives none.
  std::chrono::milliseconds collective_timeout{300000};
  // Tests: see HybridEngine's RolloutWeightsHook (corrupts the rollout's weights).
  RolloutWeightsHook rollout_weights_hook;
  // Fault drills: how long a background checkpoint save waits before it writes its files
  // (BackgroundSave's hold), so a drill can kill the worker mid-save.
  absl::Duration fault_hold_background_save = absl::ZeroDuration();
  // Fault drills: how long each rank's checkpoint upload (trainer.checkpoint_uri) waits between
  // its data files and its manifest, so a drill can kill the worker mid-upload.
  absl::Duration fault_hold_checkpoint_upload = absl::ZeroDuration();
  // Fault drills and tests: how long each decode step of a rollout pool's rank waits (the
  // engine's decode_step_hold), so that a weight update interrupts a partial rollout mid-way.
  absl::Duration fault_hold_rollout_decode_step = absl::ZeroDuration();
};

class RoleHost final : public stages::StageService {
 public:
  explicit RoleHost(RoleHostOptions options);
  // Ends every job (after the stage in hand).
  ~RoleHost() override;
  // Stops taking stages and waits at most `grace` for the stage in hand. False when it still
  // runs: its thread is left behind, so the caller must end the process rather than destroy
  // this host. Background saves are not waited for here (the destructor joins them).
  bool StopWithin(absl::Duration grace);
  RoleHost(const RoleHost&) = delete;
  RoleHost& operator=(const RoleHost&) = delete;

#define RLHFD_HOST_STAGE(Name, Request, Reply)                   \
  void Name(const v1::Request& request, absl::Duration deadline, \
            stages::StageDone<v1::Reply> done) override;
  RLHFD_STAGES(RLHFD_HOST_STAGE)
#undef RLHFD_HOST_STAGE

  // Jobs currently hosted (for the worker's status).
  int jobs() const { return hosted_jobs_.load(); }
  // Bytes the worker's tensors hold now: the CUDA caching allocator's allocated bytes on a GPU,
  // the process heap's bytes in use on the CPU. Any thread.
  int64_t MemoryInUse() const;

  // The job attempts hosted here (started, or prepared on rank 0), for the heartbeat. Any thread.
  std::vector<v1::JobAttempt> HostedAttempts() const;
  // Ends the attempts of `moved_on` that arrived here before `asked_at`, when the heartbeat
  // listing them was sent: the controller has moved those jobs on (a recovery while this worker
  // hung, the job's end), so their roles and memory go. Any thread.
  void EndMovedOn(std::vector<v1::JobAttempt> moved_on,
                  std::chrono::steady_clock::time_point asked_at);
  // Entries of the per-job call bookkeeping (cancel flags, queued pool-call counts): tests check
  // that calls naming jobs not hosted here, and starts that fail, leave none behind. Any thread.
  size_t CallBookkeepingEntries();

 private:
  // What a stage does to the job's weights, for the poisoned-job rule: a failed update poisons
  // the job (its weights may be half updated), which then refuses every later stage but one that
  // reads only the step's batch, which the update left as it was (a dump, to replay the step).
  enum class StageEffect { kLeavesWeights, kUpdatesWeights, kReadsBatchOnly };
  // Runs `body` on the executor for the job of `key`, with the stored-reply and poisoned-job
  // rules, and catches what it throws.
  // `queued`, when given, counted this call on arrival and is counted down as it leaves the queue.
  template <typename Reply, typename Body>
  void RunStage(const v1::StageKey& key, StageEffect effect, stages::StageDone<Reply> done,
                Body body, std::shared_ptr<std::atomic<int64_t>> queued = nullptr);
  // The job `job_id` when it runs `attempt` (0: any).
  absl::StatusOr<HostedJob*> FindJob(const std::string& job_id, int64_t attempt);
  // Whether HostedAttempts() lists the job. Any thread.
  bool IsHosted(const std::string& job_id) const;
  // The cancel flag of "<job>#<attempt>".
  std::shared_ptr<std::atomic<bool>> CancelFlag(const std::string& key);
  // How many calls that need the job's rollout rank between two generations (a weight update, a
  // move of rows out of the pool) wait behind the stage running: a partial rollout stops for them.
  std::shared_ptr<std::atomic<int64_t>> QueuedPoolCalls(const std::string& job_id);
  // Drops the job's roles, rendezvous and cancel flags (executor).
  void Forget(const std::string& job_id);
  // Refreshes what jobs() and HostedAttempts() report from jobs_ and prepared_ (executor).
  void PublishHosted();

  RoleHostOptions options_;
  // Executor-owned.
  std::map<std::string, std::unique_ptr<HostedJob>> jobs_;
  std::map<std::string, std::unique_ptr<PreparedJob>> prepared_;
  std::atomic<int> hosted_jobs_{0};
  mutable std::mutex hosted_mutex_;
  std::vector<v1::JobAttempt> hosted_attempts_;  // guarded by hosted_mutex_
  PromptMeasurer prompt_measurer_;
  // Shared with calling threads: EndJob cancels a job's long waits before it reaches the
  // executor.
  std::mutex cancel_mutex_;
  std::map<std::string, std::shared_ptr<std::atomic<bool>>> cancel_flags_;
  std::map<std::string, std::shared_ptr<std::atomic<int64_t>>> queued_pool_calls_;
  EventLoop executor_;  // last: stopped first, before what its tasks use is destroyed
};

}  // namespace rlhfd::roles
