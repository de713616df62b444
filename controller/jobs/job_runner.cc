#include "controller/jobs/job_runner.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging/logging.h"
#include "common/roles/pool_placement.h"
#include "common/util/text.h"

namespace rlhfd::controller {
namespace {

bool Active(v1::JobState state) {
  return state == v1::JOB_STATE_PLACING || state == v1::JOB_STATE_STARTING ||
         state == v1::JOB_STATE_RUNNING || state == v1::JOB_STATE_RECOVERING;
}

void LogIfFailed(const absl::Status& status, const std::string& what) {
  if (!status.ok()) RLOG(ERROR) << what << ": " << status.message();
}

}  // namespace

JobRunner::JobRunner(JobManager& jobs, WorkerRegistry& workers, MetricHistory& history,
                     Poster post, RunnerOptions options, Clock clock)
    : jobs_(jobs),
      workers_(workers),
      history_(history),
      post_(std::move(post)),
      options_(std::move(options)),
      clock_(std::move(clock)) {}

JobRunner::~JobRunner() { Shutdown(); }

void JobRunner::Shutdown() {
  shut_down_ = true;
  for (auto& [id, running] : running_) running.driver->Cancel(absl::AbortedError("controller stopped"));
  for (auto& [generation, driver] : stopping_) driver->Cancel();
  running_.clear();  // joins each driver's thread (it only ends the workers' roles now)
  stopping_.clear();
}

void JobRunner::RecoverAfterRestart() {
  for (const v1::Job& job : jobs_.List({})) {
    if (!Active(job.state())) continue;
    // Not the job's fault: it costs none of its trainer.max_restarts.
    Recover(job.job_id(), "the controller restarted", /*counts=*/false);
  }
}

bool JobRunner::Current(const std::string& job_id, int64_t generation) const {
  const auto found = running_.find(job_id);
  return found != running_.end() && found->second.generation == generation;
}

void JobRunner::Schedule() {
  if (shut_down_) return;
  std::map<std::string, std::string> used;
  for (const auto& [id, running] : running_) {
    for (const std::string& worker : running.workers) used[worker] = id;
  }
  const std::vector<v1::Worker> workers = workers_.List();
  // Higher priority first, then submission order (the list is oldest first; ids never repeat).
  std::vector<v1::Job> waiting = jobs_.List({v1::JOB_STATE_QUEUED, v1::JOB_STATE_RECOVERING});
  std::stable_sort(waiting.begin(), waiting.end(), [](const v1::Job& a, const v1::Job& b) {
    return a.spec().trainer().priority() > b.spec().trainer().priority();
  });
  std::optional<std::pair<int32_t, std::string>> held_back_by;  // (priority, job id)
  for (const v1::Job& job : waiting) {
    if (running_.count(job.job_id())) continue;
    const int32_t priority = job.spec().trainer().priority();
    if (held_back_by && held_back_by->first > priority) {
      const std::string waiting_behind =
          absl::StrCat("waiting behind ", held_back_by->second, " (trainer.priority ",
                       held_back_by->first, " over this job's ", priority, ")");
      if (job.message() != waiting_behind) {
        LogIfFailed(
            jobs_.Update(job.job_id(), [&](v1::Job& record) { record.set_message(waiting_behind); },
                         clock_()),
            "recording why a job waits");
      }
      continue;
    }
    const auto fault = faulted_at_.find(job.job_id());
    absl::StatusOr<Placement> placement =
        PlaceJob(job.spec(), workers, used, fault == faulted_at_.end() ? 0 : fault->second);
    if (!placement.ok()) {
      const std::string waiting =
          absl::StrCat(job.state() == v1::JOB_STATE_RECOVERING ? "recovering, " : "",
                       "waiting for workers: ", placement.status().message());
      if (job.message() != waiting) {
        LogIfFailed(jobs_.Update(job.job_id(), [&](v1::Job& record) { record.set_message(waiting); },
                                 clock_()),
                    "recording why a job waits");
      }
      if (!held_back_by) held_back_by.emplace(priority, job.job_id());
      continue;
    }
    for (const std::string& worker : placement->worker_ids) used[worker] = job.job_id();
    Start(job, *placement);
  }
}

void JobRunner::Start(const v1::Job& job, const Placement& placement) {
  const std::string id = job.job_id();
  faulted_at_.erase(id);
  const std::vector<v1::PoolAssignment> pools = roles::PlacePools(job.spec());
  v1::JobProgress progress = job.progress();
  progress.set_attempt(progress.attempt() + 1);
  LogIfFailed(jobs_.Update(id,
                           [&](v1::Job& record) {
                             record.mutable_progress()->set_attempt(progress.attempt());
                             record.clear_placement();
                             for (const v1::PoolAssignment& pool : pools) {
                               v1::RolePlacement* role = record.add_placement();
                               role->set_role(pool.role());
                               for (int rank : pool.ranks()) {
                                 role->add_worker_ids(placement.worker_ids[rank]);
                               }
                             }
                           },
                           clock_()),
              "recording a placement");
  LogIfFailed(jobs_.TransitionTo(id, v1::JOB_STATE_PLACING,
                                 absl::StrCat("placed on ", absl::StrJoin(placement.worker_ids, ", ")),
                                 clock_()),
              "placing a job");
  const int64_t generation = next_generation_++;
  DriverSetup setup{.job_id = id,
                    .spec = job.spec(),
                    .addresses = placement.addresses,
                    .nccl = placement.gpu,
                    .token = options_.token,
                    .rpc = options_.rpc,
                    .progress = progress,
                    .stage_deadline = options_.stage_deadline,
                    .communicator_timeout_ms = options_.communicator_timeout_ms};
  DriverEvents events{
      .running =
          [this, id, generation](int64_t resumed_after) {
            post_([this, id, generation, resumed_after] {
              OnRunning(id, generation, resumed_after);
            });
          },
      .step =
          [this, id, generation](const v1::StepMetrics& step, const v1::JobProgress& progress) {
            post_([this, id, generation, step, progress] {
              OnStep(id, generation, step, progress);
            });
          },
      .finished =
          [this, id, generation](absl::Status status, bool fault) {
            post_([this, id, generation, status, fault] {
              OnFinished(id, generation, status, fault);
            });
          }};
  LogIfFailed(jobs_.TransitionTo(id, v1::JOB_STATE_STARTING,
                                 absl::StrCat("starting roles on ", placement.worker_ids.size(),
                                              " workers and loading models"),
                                 clock_()),
              "starting a job");
  const std::vector<std::string> loggers(job.spec().trainer().loggers().begin(),
                                         job.spec().trainer().loggers().end());
  absl::StatusOr<std::vector<std::unique_ptr<MetricSink>>> sinks =
      MakeMetricSinks(id, loggers, absl::StrCat(options_.log_dir, "/", id));
  if (sinks.ok()) {
    sinks_[id] = *std::move(sinks);
  } else {
    // The history still holds every step; the job need not fail for a log file.
    RLOG(ERROR) << id << ": no metric sinks: " << sinks.status().message();
    sinks_.erase(id);
  }
  running_[id] = Running{std::make_unique<JobDriver>(std::move(setup), std::move(events)),
                         placement.worker_ids, generation};
}

void JobRunner::OnRunning(const std::string& job_id, int64_t generation, int64_t resumed_after) {
  if (!Current(job_id, generation)) return;
  // The steps after the checkpoint run again: the sinks drop an earlier run's records of them,
  // so each step is in the logs once (the history replaces a step's record when it is re-run).
  if (const auto sinks = sinks_.find(job_id); sinks != sinks_.end()) {
    for (const auto& sink : sinks->second) {
      LogIfFailed(sink->StartRun(resumed_after), "dropping re-run steps from a job's logs");
    }
  }
  LogIfFailed(
      jobs_.TransitionTo(
          job_id, v1::JOB_STATE_RUNNING,
          resumed_after > 0 ? absl::StrCat("resumed after step ", resumed_after) : "running",
          clock_()),
      "running a job");
}

void JobRunner::OnStep(const std::string& job_id, int64_t generation, const v1::StepMetrics& step,
                       const v1::JobProgress& progress) {
  if (!Current(job_id, generation)) return;
  // The history first: a step the job record counts is a step the history holds.
  LogIfFailed(history_.Put(job_id, step), "recording a step's metrics");
  if (const auto sinks = sinks_.find(job_id); sinks != sinks_.end()) {
    for (const auto& sink : sinks->second) LogIfFailed(sink->Write(step), "logging a step");
  }
  LogIfFailed(jobs_.Update(job_id,
                           [&](v1::Job& record) {
                             const int32_t restarts = record.progress().restarts();
                             const auto causes = record.progress().restart_causes();
                             *record.mutable_progress() = progress;
                             record.mutable_progress()->set_restarts(restarts);
                             *record.mutable_progress()->mutable_restart_causes() = causes;
                           },
                           clock_()),
              "recording a job's progress");
  jobs_.PublishStep(job_id, step);
}

void JobRunner::OnFinished(const std::string& job_id, int64_t generation,
                           const absl::Status& status, bool fault) {
  stopping_.erase(generation);  // a cancelled run's clean-up is over
  if (!Current(job_id, generation)) return;
  running_.erase(job_id);  // joins the driver's thread, which is returning
  sinks_.erase(job_id);
  if (status.ok()) {
    const absl::StatusOr<v1::Job> job = jobs_.Get(job_id);
    LogIfFailed(jobs_.TransitionTo(job_id, v1::JOB_STATE_SUCCEEDED,
                                   absl::StrCat("finished ",
                                                job.ok() ? job->progress().current_step() : 0,
                                                " steps"),
                                   clock_()),
                "finishing a job");
  } else if (fault) {
    Recover(job_id, std::string(status.message()));
  } else {
    LogIfFailed(jobs_.TransitionTo(job_id, v1::JOB_STATE_FAILED,
                                   SanitizeForDisplay(status.message(), 2000), clock_()),
                "failing a job");
  }
  Schedule();
}

void JobRunner::Recover(const std::string& job_id, const std::string& cause, bool counts) {
  const absl::StatusOr<v1::Job> job = jobs_.Get(job_id);
  if (!job.ok()) return;
  const int32_t restarts = job->progress().restarts();
  const std::string shown = SanitizeForDisplay(cause, 500);
  faulted_at_[job_id] = clock_();
  if (!counts) {
    LogIfFailed(jobs_.Update(job_id, [](v1::Job& record) { record.clear_placement(); }, clock_()),
                "recording a restart");
    LogIfFailed(jobs_.TransitionTo(job_id, v1::JOB_STATE_RECOVERING, shown, clock_()),
                "recovering a job");
    return;
  }
  if (restarts >= job->spec().trainer().max_restarts()) {
    faulted_at_.erase(job_id);
    std::vector<std::string> causes(job->progress().restart_causes().begin(),
                                    job->progress().restart_causes().end());
    causes.push_back(shown);
    LogIfFailed(jobs_.TransitionTo(job_id, v1::JOB_STATE_FAILED,
                                   absl::StrCat("gave up after ", restarts,
                                                " restarts (trainer.max_restarts); causes: ",
                                                absl::StrJoin(causes, "; ")),
                                   clock_()),
                "failing a job");
    return;
  }
  LogIfFailed(jobs_.Update(job_id,
                           [&](v1::Job& record) {
                             record.mutable_progress()->set_restarts(restarts + 1);
                             record.mutable_progress()->add_restart_causes(shown);
                             record.clear_placement();
                           },
                           clock_()),
              "recording a restart");
  LogIfFailed(jobs_.TransitionTo(job_id, v1::JOB_STATE_RECOVERING,
                                 absl::StrCat("restart ", restarts + 1, ": ", shown), clock_()),
              "recovering a job");
}

void JobRunner::Cancelled(const std::string& job_id) {
  faulted_at_.erase(job_id);
  const auto found = running_.find(job_id);
  if (found != running_.end()) {
    found->second.driver->Cancel();
    stopping_[found->second.generation] = std::move(found->second.driver);
    running_.erase(found);
    sinks_.erase(job_id);
  }
  Schedule();
}

void JobRunner::WorkersLost(const std::vector<std::string>& worker_ids) {
  for (auto& [id, running] : running_) {
    for (const std::string& lost : worker_ids) {
      if (std::find(running.workers.begin(), running.workers.end(), lost) != running.workers.end()) {
        running.driver->Cancel(absl::UnavailableError(
            absl::StrCat("worker ", lost, " was lost (no heartbeat within the liveness window)")));
        break;
      }
    }
  }
}

}  // namespace rlhfd::controller
