#include "worker/roles/role_host.h"

#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "common/rpc/pending_unary.h"
#include "common/status/status_macros.h"
#include "common/util/text.h"
#include "worker/device/device_memory.h"
#include "worker/roles/batch_stages.h"
#include "worker/roles/checkpoint_stages.h"
#include "worker/roles/hosted_job.h"
#include "worker/roles/job_bootstrap.h"
#include "worker/roles/stage_profile.h"

namespace rlhfd::roles {

using stages::StageDone;

namespace {

constexpr size_t kMaxStageName = 128;

std::string KeyText(const v1::StageKey& key) {
  return absl::StrCat("job ", SanitizeForDisplay(key.job_id(), 80), " step ", key.step(), " ",
                      SanitizeForDisplay(key.stage(), 60));
}

absl::Status CheckKey(const v1::StageKey& key) {
  if (key.step() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(KeyText(key), ": key.step must be >= 1"));
  }
  if (key.stage().empty() || key.stage().size() > kMaxStageName) {
    return absl::InvalidArgumentError(
        absl::StrCat(KeyText(key), ": key.stage must be 1-", kMaxStageName, " characters"));
  }
  return absl::OkStatus();
}

}  // namespace

RoleHost::RoleHost(RoleHostOptions options) : options_(std::move(options)) {}

RoleHost::~RoleHost() { StopWithin(absl::InfiniteDuration()); }

bool RoleHost::StopWithin(absl::Duration grace) {
  {
    std::lock_guard<std::mutex> lock(cancel_mutex_);
    for (auto& [id, flag] : cancel_flags_) flag->store(true);
  }
  return executor_.StopWithin(grace);
}

std::shared_ptr<std::atomic<int64_t>> RoleHost::QueuedPoolCalls(const std::string& job_id) {
  std::lock_guard<std::mutex> lock(cancel_mutex_);
  // A job not hosted here gets a count of its own: its call fails in FindJob, and an entry kept
  // for it would never go (Forget runs for jobs that were hosted). A hosted job's entry made
  // here while Forget runs goes with it: Forget unpublishes the job before it takes this mutex.
  if (!IsHosted(job_id)) return std::make_shared<std::atomic<int64_t>>(0);
  auto& count = queued_pool_calls_[job_id];
  if (!count) count = std::make_shared<std::atomic<int64_t>>(0);
  return count;
}

std::shared_ptr<std::atomic<bool>> RoleHost::CancelFlag(const std::string& key) {
  std::lock_guard<std::mutex> lock(cancel_mutex_);
  auto& flag = cancel_flags_[key];
  if (!flag) flag = std::make_shared<std::atomic<bool>>(false);
  return flag;
}

bool RoleHost::IsHosted(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(hosted_mutex_);
  for (const v1::JobAttempt& hosted : hosted_attempts_) {
    if (hosted.job_id() == job_id) return true;
  }
  return false;
}

size_t RoleHost::CallBookkeepingEntries() {
  std::lock_guard<std::mutex> lock(cancel_mutex_);
  return cancel_flags_.size() + queued_pool_calls_.size();
}

absl::StatusOr<HostedJob*> RoleHost::FindJob(const std::string& job_id, int64_t attempt) {
  RETURN_IF_ERROR(CheckAttempt(attempt));
  const auto found = jobs_.find(job_id);
  if (found != jobs_.end() && found->second->attempt != attempt) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", SanitizeForDisplay(job_id, 80), " runs attempt ", found->second->attempt,
        " here, not ", attempt, " (a newer driver has taken it over)"));
  }
  if (found == jobs_.end()) {
    // UNAVAILABLE: to the driver this worker cannot serve the job now (it never started it, or
    // it restarted and lost it), which a restart of the job cures.
    return absl::UnavailableError(absl::StrCat("job ", SanitizeForDisplay(job_id, 80),
                                               " is not running on this worker (StartJob first; "
                                               "or the worker restarted)"));
  }
  return found->second.get();
}

template <typename Reply, typename Body>
void RoleHost::RunStage(const v1::StageKey& key, StageEffect effect, StageDone<Reply> done,
                        Body body, std::shared_ptr<std::atomic<int64_t>> queued) {
  executor_.Post([this, key, effect, done = std::move(done), body = std::move(body),
                  queued = std::move(queued)]() mutable {
    if (queued) queued->fetch_sub(1);
    logging::ScopedLogContext context({.job = key.job_id(), .step = key.step()});
    absl::StatusOr<Reply> result = CatchAll<Reply>(key.stage(), [&]() -> absl::StatusOr<Reply> {
      RETURN_IF_ERROR(CheckKey(key));
      ASSIGN_OR_RETURN(HostedJob * job, FindJob(key.job_id(), key.attempt()));
      const std::pair<int64_t, std::string> id(key.step(), key.stage());
      if (const auto stored = job->replies.find(id); stored != job->replies.end()) {
        Reply reply;
        reply.ParseFromString(stored->second);
        return reply;  // a retry: the first call's reply, nothing run again
      }
      if (!job->poisoned.empty() && effect != StageEffect::kReadsBatchOnly) {
        return absl::FailedPreconditionError(absl::StrCat(
            KeyText(key), ": ", job->poisoned, "; load a checkpoint before further stages"));
      }
      absl::StatusOr<Reply> reply;
      {
        const StageProfile profile(job->spec, key.step(), key.stage(), job->layout->rank());
        reply = body(*job);
      }
      if (!reply.ok()) {
        if (effect == StageEffect::kUpdatesWeights)
          job->poisoned = absl::StrCat(key.stage(), " of step ", key.step(), " failed");
        return absl::Status(reply.status().code(),
                            absl::StrCat(KeyText(key), ": ", reply.status().message()));
      }
      // Replies of steps before the previous one are no longer retried.
      while (!job->replies.empty() && job->replies.begin()->first.first < key.step() - 1) {
        job->replies.erase(job->replies.begin());
      }
      job->replies[id] = reply->SerializeAsString();
      return reply;
    });
    if (!result.ok()) RLOG(WARNING) << result.status().message();
    done(std::move(result));
  });
}

// Job bootstrap.

void RoleHost::PrepareJob(const v1::PrepareJobRequest& request, absl::Duration,
                          StageDone<v1::PrepareJobReply> done) {
  const auto arrived = std::chrono::steady_clock::now();
  executor_.Post([this, request, arrived, done = std::move(done)] {
    absl::StatusOr<v1::PrepareJobReply> result =
        CatchAll<v1::PrepareJobReply>("PrepareJob", [&]() -> absl::StatusOr<v1::PrepareJobReply> {
          if (request.job_id().empty() || request.job_id().size() > 128) {
            return absl::InvalidArgumentError("PrepareJob: job_id must be 1-128 characters");
          }
          RETURN_IF_ERROR(CheckAttempt(request.attempt()));
          if (const auto running = jobs_.find(request.job_id()); running != jobs_.end()) {
            if (running->second->attempt == request.attempt()) {
              return absl::AlreadyExistsError(absl::StrCat("job ", request.job_id(), " attempt ",
                                                           request.attempt(),
                                                           " is already running here"));
            }
            RLOG(INFO) << "job " << request.job_id() << ": attempt " << request.attempt()
                       << " replaces attempt " << running->second->attempt;
            jobs_.erase(running);
            prepared_.erase(request.job_id());
          }
          if (const auto stale = prepared_.find(request.job_id());
              stale != prepared_.end() && stale->second->attempt != request.attempt()) {
            prepared_.erase(stale);
          }
          auto& prepared = prepared_[request.job_id()];
          if (!prepared) {
            absl::StatusOr<std::unique_ptr<PreparedJob>> made =
                PrepareRendezvous(request, options_, arrived);
            if (!made.ok()) {
              prepared_.erase(request.job_id());
              return made.status();
            }
            prepared = *std::move(made);
          }
          v1::PrepareJobReply reply;
          *reply.mutable_bootstrap() = prepared->bootstrap;
          return reply;
        });
    // Published before the reply: the calls it lets the driver make find the job hosted.
    PublishHosted();
    done(std::move(result));
  });
}

void RoleHost::StartJob(const v1::StartJobRequest& request, absl::Duration,
                        StageDone<v1::StartJobReply> done) {
  const std::string attempt_key = absl::StrCat(request.job_id(), "#", request.attempt());
  // Moved into the task, so that the flag's holders are the map, this task and any other call
  // for the attempt (the failure path below counts them).
  std::shared_ptr<std::atomic<bool>> cancelled = CancelFlag(attempt_key);
  const auto arrived = std::chrono::steady_clock::now();
  executor_.Post([this, request, attempt_key, cancelled = std::move(cancelled), arrived,
                  done = std::move(done)] {
    logging::ScopedLogContext context({.job = request.job_id(), .rank = request.rank()});
    absl::StatusOr<v1::StartJobReply> result = CatchAll<
        v1::StartJobReply>("StartJob", [&]() -> absl::StatusOr<v1::StartJobReply> {
      const auto start = std::chrono::steady_clock::now();
      RETURN_IF_ERROR(CheckAttempt(request.attempt()));
      if (const auto running = jobs_.find(request.job_id()); running != jobs_.end()) {
        if (running->second->attempt == request.attempt()) return running->second->started;
        // A newer attempt (a recovering driver): the older one's roles and communicators go.
        RLOG(INFO) << "attempt " << request.attempt() << " replaces attempt "
                   << running->second->attempt;
        jobs_.erase(running);
      }
      ASSIGN_OR_RETURN(std::unique_ptr<HostedJob> job,
                       StartHostedJob(request, options_, cancelled, arrived, prepared_));
      job->started.set_load_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now() - start)
                                   .count());
      const v1::StartJobReply reply = job->started;
      RLOG(INFO) << "started rank " << request.rank() << " of " << request.world_size()
                 << " hosting " << reply.roles_size() << " role(s) in " << reply.load_ms() << " ms";
      jobs_[request.job_id()] = std::move(job);
      return reply;
    });
    if (!result.ok()) {
      // The attempt does not run here (a running one would have answered): its cancel flag goes,
      // unless another call for it holds the flag too (a retry queued behind this one).
      std::lock_guard<std::mutex> lock(cancel_mutex_);
      const auto flag = cancel_flags_.find(attempt_key);
      if (flag != cancel_flags_.end() && flag->second.use_count() <= 2) cancel_flags_.erase(flag);
    }
    // Published before the reply: the calls it lets the driver make find the job hosted.
    PublishHosted();
    done(std::move(result));
  });
}

// Batch stages: each runs under RunStage's rules; only the updates mutate the weights (a failed
// one poisons the job).

void RoleHost::Generate(const v1::GenerateRequest& request, absl::Duration,
                        StageDone<v1::GenerateReply> done) {
  RunStage<v1::GenerateReply>(
      request.key(), StageEffect::kLeavesWeights, std::move(done),
      [request, device = options_.device, queued = QueuedPoolCalls(request.key().job_id())](
          HostedJob& job) { return RunGenerate(job, request, device, queued.get()); });
}

void RoleHost::SyncWeights(const v1::SyncWeightsRequest& request, absl::Duration,
                           StageDone<v1::SyncWeightsReply> done) {
  // Counted before it is queued: a partial rollout running stops for it.
  std::shared_ptr<std::atomic<int64_t>> queued = QueuedPoolCalls(request.key().job_id());
  queued->fetch_add(1);
  RunStage<v1::SyncWeightsReply>(
      request.key(), StageEffect::kLeavesWeights, std::move(done),
      [request](HostedJob& job) { return RunSyncWeights(job, request); }, std::move(queued));
}

void RoleHost::MoveTensors(const v1::MoveTensorsRequest& request, absl::Duration,
                           StageDone<v1::MoveTensorsReply> done) {
  std::shared_ptr<std::atomic<int64_t>> queued;
  if (request.from_role() == v1::ROLE_ROLLOUT) {
    queued = QueuedPoolCalls(request.key().job_id());
    queued->fetch_add(1);
  }
  RunStage<v1::MoveTensorsReply>(
      request.key(), StageEffect::kLeavesWeights, std::move(done),
      [request, device = options_.device](HostedJob& job) {
        return RunMoveTensors(job, request, device);
      },
      std::move(queued));
}

void RoleHost::Forward(const v1::ForwardRequest& request, absl::Duration,
                       StageDone<v1::ForwardReply> done) {
  RunStage<v1::ForwardReply>(request.key(), StageEffect::kLeavesWeights, std::move(done),
                             [request](HostedJob& job) { return RunForward(job, request); });
}

void RoleHost::ComputeRewards(const v1::RewardRequest& request, absl::Duration,
                              StageDone<v1::RewardReply> done) {
  RunStage<v1::RewardReply>(request.key(), StageEffect::kLeavesWeights, std::move(done),
                            [request](HostedJob& job) { return RunRewards(job, request); });
}

void RoleHost::ComputeAdvantages(const v1::AdvantageRequest& request, absl::Duration,
                                 StageDone<v1::AdvantageReply> done) {
  RunStage<v1::AdvantageReply>(request.key(), StageEffect::kLeavesWeights, std::move(done),
                               [request](HostedJob& job) { return RunAdvantages(job, request); });
}

void RoleHost::UpdateActor(const v1::UpdateRequest& request, absl::Duration,
                           StageDone<v1::UpdateReply> done) {
  RunStage<v1::UpdateReply>(request.key(), StageEffect::kUpdatesWeights, std::move(done),
                            [request](HostedJob& job) { return RunUpdateActor(job, request); });
}

void RoleHost::UpdateCritic(const v1::UpdateRequest& request, absl::Duration,
                            StageDone<v1::UpdateReply> done) {
  RunStage<v1::UpdateReply>(request.key(), StageEffect::kUpdatesWeights, std::move(done),
                            [request](HostedJob& job) { return RunUpdateCritic(job, request); });
}

void RoleHost::Validate(const v1::ValidateRequest& request, absl::Duration,
                        StageDone<v1::ValidateReply> done) {
  RunStage<v1::ValidateReply>(request.key(), StageEffect::kLeavesWeights, std::move(done),
                              [request](HostedJob& job) { return RunValidate(job, request); });
}

void RoleHost::DumpBatch(const v1::DumpBatchRequest& request, absl::Duration,
                         StageDone<v1::DumpBatchReply> done) {
  RunStage<v1::DumpBatchReply>(request.key(), StageEffect::kReadsBatchOnly, std::move(done),
                               [request](HostedJob& job) { return RunDumpBatch(job, request); });
}

void RoleHost::MeasurePrompts(const v1::MeasurePromptsRequest& request, absl::Duration,
                              StageDone<v1::MeasurePromptsReply> done) {
  // No job: the controller measures a job's prompts before it starts one.
  executor_.Post([this, request, done = std::move(done)] {
    logging::ScopedLogContext context({.job = request.key().job_id()});
    done(CatchAll<v1::MeasurePromptsReply>("MeasurePrompts",
                                           [&] { return prompt_measurer_.Measure(request); }));
  });
}

// Checkpoint and offload stages.

void RoleHost::SaveCheckpoint(const v1::CheckpointRequest& request, absl::Duration,
                              StageDone<v1::CheckpointReply> done) {
  RunStage<v1::CheckpointReply>(
      request.key(), StageEffect::kLeavesWeights, std::move(done),
      [request, hold = options_.fault_hold_background_save](HostedJob& job) {
        return RunSaveCheckpoint(job, request, hold);
      });
}

void RoleHost::CommitCheckpoint(const v1::CheckpointRequest& request, absl::Duration,
                                StageDone<v1::CheckpointReply> done) {
  RunStage<v1::CheckpointReply>(
      request.key(), StageEffect::kLeavesWeights, std::move(done),
      [request](HostedJob& job) { return RunCommitCheckpoint(job, request); });
}

void RoleHost::LoadCheckpoint(const v1::CheckpointRequest& request, absl::Duration,
                              StageDone<v1::CheckpointReply> done) {
  // Loading is what clears a poisoned job, so it runs outside RunStage's refusal.
  executor_.Post([this, request, done = std::move(done)] {
    logging::ScopedLogContext context({.job = request.key().job_id()});
    done(CatchAll<v1::CheckpointReply>("LoadCheckpoint", [&]() -> absl::StatusOr<v1::CheckpointReply> {
      ASSIGN_OR_RETURN(HostedJob * job, FindJob(request.key().job_id(), request.key().attempt()));
      return RunLoadCheckpoint(*job, request);
    }));
  });
}

void RoleHost::Offload(const v1::OffloadRequest& request, absl::Duration,
                       StageDone<v1::OffloadReply> done) {
  RunStage<v1::OffloadReply>(request.key(), StageEffect::kLeavesWeights, std::move(done),
                             [request, device = options_.device](HostedJob& job) {
                               return RunOffload(job, request, device);
                             });
}

// Job end.

void RoleHost::EndJob(const v1::EndJobRequest& request, absl::Duration,
                      StageDone<v1::EndJobReply> done) {
  if (absl::Status valid = CheckAttempt(request.attempt()); !valid.ok()) {
    done(valid);
    return;
  }
  {
    // The attempt's long waits (a remote reward) end now; a newer attempt's are not touched.
    std::lock_guard<std::mutex> lock(cancel_mutex_);
    const std::string prefix = request.job_id() + "#";
    for (auto& [key, flag] : cancel_flags_) {
      if (key.rfind(prefix, 0) != 0) continue;
      if (key == absl::StrCat(prefix, request.attempt())) flag->store(true);
    }
  }
  executor_.Post([this, request, done = std::move(done)] {
    done(CatchAll<v1::EndJobReply>("EndJob", [&]() -> absl::StatusOr<v1::EndJobReply> {
      const auto running = jobs_.find(request.job_id());
      if (running != jobs_.end() && running->second->attempt != request.attempt()) {
        return v1::EndJobReply();  // a newer attempt runs: not this call's to end
      }
      Forget(request.job_id());
      return v1::EndJobReply();
    }));
  });
}

void RoleHost::Forget(const std::string& job_id) {
  jobs_.erase(job_id);
  prepared_.erase(job_id);
  PublishHosted();
  std::lock_guard<std::mutex> lock(cancel_mutex_);
  for (auto it = cancel_flags_.begin(); it != cancel_flags_.end();) {
    it = it->first.rfind(job_id + "#", 0) == 0 ? cancel_flags_.erase(it) : ++it;
  }
  queued_pool_calls_.erase(job_id);
}

void RoleHost::PublishHosted() {
  std::vector<v1::JobAttempt> hosted;
  const auto add = [&](const std::string& job_id, int64_t attempt) {
    v1::JobAttempt& entry = hosted.emplace_back();
    entry.set_job_id(job_id);
    entry.set_attempt(attempt);
  };
  for (const auto& [job_id, job] : jobs_) add(job_id, job->attempt);
  for (const auto& [job_id, prepared] : prepared_) {
    if (!jobs_.count(job_id)) add(job_id, prepared->attempt);
  }
  hosted_jobs_ = static_cast<int>(jobs_.size());
  std::lock_guard<std::mutex> lock(hosted_mutex_);
  hosted_attempts_ = std::move(hosted);
}

std::vector<v1::JobAttempt> RoleHost::HostedAttempts() const {
  std::lock_guard<std::mutex> lock(hosted_mutex_);
  return hosted_attempts_;
}

void RoleHost::EndMovedOn(std::vector<v1::JobAttempt> moved_on,
                          std::chrono::steady_clock::time_point asked_at) {
  if (moved_on.empty()) return;
  {
    // A stage of such an attempt may wait in a collective for peers that have moved on: it ends
    // now, not at the collective timeout. (The controller never runs that attempt here again.)
    std::lock_guard<std::mutex> lock(cancel_mutex_);
    for (const v1::JobAttempt& stale : moved_on) {
      const auto flag = cancel_flags_.find(absl::StrCat(stale.job_id(), "#", stale.attempt()));
      if (flag != cancel_flags_.end()) flag->second->store(true);
    }
  }
  executor_.Post([this, moved_on = std::move(moved_on), asked_at] {
    for (const v1::JobAttempt& stale : moved_on) {
      const auto job = jobs_.find(stale.job_id());
      const auto prepared = prepared_.find(stale.job_id());
      // Only the attempt the heartbeat listed, and only if it was here before that heartbeat: a
      // newer one that arrived since is the controller's current run.
      const bool listed_job = job != jobs_.end() && job->second->attempt == stale.attempt() &&
                              job->second->arrived < asked_at;
      const bool listed_rendezvous = job == jobs_.end() && prepared != prepared_.end() &&
                                     prepared->second->attempt == stale.attempt() &&
                                     prepared->second->arrived < asked_at;
      if (!listed_job && !listed_rendezvous) continue;
      RLOG(WARNING) << "job " << SanitizeForDisplay(stale.job_id(), 80) << " attempt "
                    << stale.attempt()
                    << ": the controller no longer runs it here (it moved the job on while this "
                       "worker was unreachable); ending it and freeing its memory";
      Forget(stale.job_id());
    }
  });
}

int64_t RoleHost::MemoryInUse() const { return worker::BytesInUse(options_.device); }

}  // namespace rlhfd::roles
