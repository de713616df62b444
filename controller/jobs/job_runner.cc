#include "controller/jobs/job_runner.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/jobs/job_states.h"
#include "common/logging/logging.h"
#include "common/stages/role_names.h"
#include "common/util/text.h"
#include "controller/cluster/pool_placement.h"

namespace rlhfd::controller {
namespace {

void LogIfFailed(const absl::Status& status, const std::string& what) {
  if (!status.ok()) RLOG(ERROR) << what << ": " << status.message();
}

}  // namespace

JobRunner::JobRunner(JobManager& jobs, WorkerRegistry& workers, MetricHistory& history, Poster post,
                     RunnerOptions options, Clock clock)
    : jobs_(jobs),
      workers_(workers),
      history_(history),
      post_(std::move(post)),
      options_(std::move(options)),
      clock_(std::move(clock)) {}

JobRunner::~JobRunner() { Shutdown(); }

void JobRunner::Shutdown() {
  shut_down_ = true;
  for (auto& [id, running] : running_)
    running.driver->Cancel(absl::AbortedError("controller stopped"));
  for (auto& [generation, driver] : stopping_) driver->Cancel();
  running_.clear();  // joins each driver's thread (it only ends the workers' roles now)
  stopping_.clear();
}

void JobRunner::RecoverAfterRestart() {
  JobQuery active;
  active.states = ActiveJobStates();
  const absl::StatusOr<JobPage> jobs = jobs_.List(active);
  if (!jobs.ok()) {
    RLOG(ERROR) << "recovering the jobs of the previous controller: " << jobs.status().message();
    return;
  }
  for (const v1::Job& job : jobs->jobs) {
    // Not the job's fault: it costs none of its trainer.max_restarts.
    Recover(job.job_id(), "the controller restarted", /*counts=*/false);
  }
}

bool JobRunner::Current(const std::string& job_id, int64_t generation) const {
  const auto found = running_.find(job_id);
  return found != running_.end() && found->second.generation == generation;
}

std::map<std::string, std::string> JobRunner::WorkerJobs() const {
  std::map<std::string, std::string> jobs;
  for (const auto& [id, running] : running_) {
    for (const std::string& worker : running.workers) jobs[worker] = id;
  }
  return jobs;
}

JobRunner::Pass JobRunner::BeginPass() const {
  Pass pass;
  pass.used = WorkerJobs();
  pass.workers = workers_.List();
  return pass;
}

void JobRunner::Schedule() {
  if (shut_down_) return;
  Pass pass = BeginPass();
  // The queue is in placement order: higher priority first, then submission order.
  for (const std::string& id : jobs_.Waiting()) Consider(id, pass);
  held_back_by_ = pass.held_back_by;
}

void JobRunner::Submitted(const std::string& job_id) {
  if (shut_down_) return;
  // Nothing but this job changed since the last pass placed what it could (every change of
  // workers or running jobs schedules a pass): only this job may be placeable now, behind the
  // job that held the last pass back.
  Pass pass = BeginPass();
  pass.held_back_by = held_back_by_;
  Consider(job_id, pass);
  held_back_by_ = pass.held_back_by;
}

void JobRunner::Consider(const std::string& id, Pass& pass) {
  const JobSummary* job = jobs_.Summary(id);
  if (job == nullptr || !IsWaiting(job->state) || running_.count(id)) return;
  const int32_t priority = job->priority;
  if (pass.held_back_by && pass.held_back_by->first > priority) {
    jobs_.SetWaitingReason(
        id, absl::StrCat("waiting behind ", pass.held_back_by->second, " (trainer.priority ",
                         pass.held_back_by->first, " over this job's ", priority, ")"));
    return;
  }
  const auto fault = faulted_at_.find(id);
  const int64_t heard_after = fault == faulted_at_.end() ? 0 : fault->second;
  // Apart from the workers that left a run of this job without an answer, where it can be.
  const auto avoided = avoided_.find(id);
  const absl::StatusOr<Placement> placement = PlaceJobAfterFault(
      job->need, pass.workers, pass.used,
      avoided == avoided_.end() ? std::set<std::string>() : avoided->second, heard_after);
  if (!placement.ok()) {
    jobs_.SetWaitingReason(
        id, absl::StrCat(job->state == v1::JOB_STATE_RECOVERING ? "recovering, " : "",
                         "waiting for workers: ", placement.status().message()));
    // In a pass (placement order) the first job that does not fit; a job submitted since may
    // outrank it.
    if (!pass.held_back_by || pass.held_back_by->first < priority) {
      pass.held_back_by.emplace(priority, id);
    }
    return;
  }
  const absl::StatusOr<v1::Job> record = jobs_.Get(id);
  if (!record.ok()) {
    RLOG(ERROR) << "placing " << id << ": " << record.status().message();
    return;
  }
  for (const std::string& worker : placement->worker_ids) pass.used[worker] = id;
  Start(*record, *placement);
}

std::string JobRunner::ApartFrom(const std::string& job_id, const Placement& placement) const {
  const auto avoided = avoided_.find(job_id);
  if (avoided == avoided_.end()) return "";
  std::vector<std::string> apart;
  for (const std::string& worker : avoided->second) {
    if (std::find(placement.worker_ids.begin(), placement.worker_ids.end(), worker) ==
        placement.worker_ids.end()) {
      apart.push_back(worker);
    }
  }
  if (apart.empty()) return "";
  return absl::StrCat(" (apart from ", absl::StrJoin(apart, ", "),
                      ", which left a stage unanswered)");
}

void JobRunner::Start(const v1::Job& job, const Placement& placement) {
  const std::string id = job.job_id();
  faulted_at_.erase(id);
  const std::vector<v1::PoolAssignment> pools = PlacePools(job.spec());
  v1::JobProgress progress = job.progress();
  progress.set_attempt(progress.attempt() + 1);
  LogIfFailed(jobs_.Update(
                  id,
                  [&](v1::Job& record) {
                    record.mutable_progress()->set_attempt(progress.attempt());
                    record.clear_placement();
                    for (const v1::PoolAssignment& pool : pools) {
                      v1::RolePlacement* role = record.add_placement();
                      role->set_role(stages::RoleName(pool.role()));
                      for (int rank : pool.ranks()) {
                        role->add_worker_ids(placement.worker_ids[rank]);
                      }
                    }
                  },
                  clock_()),
              "recording a placement");
  LogIfFailed(
      jobs_.TransitionTo(id, v1::JOB_STATE_PLACING,
                         absl::StrCat("placed on ", absl::StrJoin(placement.worker_ids, ", "),
                                      ApartFrom(id, placement),
                                      placement.shared_gpu.empty()
                                          ? ""
                                          : absl::StrCat("; ", placement.shared_gpu,
                                                         ": the job's collectives run over "
                                                         "sockets through host memory (NCCL "
                                                         "refuses two ranks on one GPU), slowly")),
                         clock_()),
      "placing a job");
  const int64_t generation = next_generation_++;
  DriverSetup setup{.job_id = id,
                    .job_submit_time_ms = job.submit_time_ms(),
                    .spec = job.spec(),
                    .addresses = placement.addresses,
                    .worker_ids = placement.worker_ids,
                    .nccl = placement.nccl,
                    .token = options_.token,
                    .rpc = options_.rpc,
                    .progress = progress,
                    .stage_deadline = options_.stage_deadline,
                    .stage_relay_above = options_.stage_relay_above,
                    .communicator_timeout_ms = options_.communicator_timeout_ms,
                    .disk_full_timeout = options_.disk_full_timeout};
  DriverEvents events{
      .running =
          [this, id, generation](const v1::JobProgress& progress) {
            post_([this, id, generation, progress] { OnRunning(id, generation, progress); });
          },
      .notice =
          [this, id, generation](const std::string& notice) {
            post_([this, id, generation, notice] { OnNotice(id, generation, notice); });
          },
      .step =
          [this, id, generation](const v1::StepMetrics& step, const v1::JobProgress& progress) {
            post_(
                [this, id, generation, step, progress] { OnStep(id, generation, step, progress); });
          },
      .finished =
          [this, id, generation](absl::Status status, bool fault,
                                 std::vector<std::string> unanswered) {
            post_([this, id, generation, status, fault, unanswered = std::move(unanswered)] {
              OnFinished(id, generation, status, fault, unanswered);
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
                         placement.worker_ids, generation, progress.attempt()};
}

bool JobRunner::MovedOn(const std::string& worker_id, const v1::JobAttempt& attempt) const {
  // A job this controller does not know was deleted after its end (or its state directory was
  // lost): nothing drives it any more, and its worker would hold its memory for good.
  if (!jobs_.Contains(attempt.job_id())) return true;
  const auto run = running_.find(attempt.job_id());
  return run == running_.end() || run->second.attempt != attempt.attempt() ||
         std::find(run->second.workers.begin(), run->second.workers.end(), worker_id) ==
             run->second.workers.end();
}

void JobRunner::OnRunning(const std::string& job_id, int64_t generation,
                          const v1::JobProgress& progress) {
  if (!Current(job_id, generation)) return;
  // The step loaded, which is older than the record's when a damaged checkpoint was passed over.
  RecordProgress(job_id, progress);
  const int64_t step = progress.checkpoint_step();
  // The steps after the checkpoint run again: the sinks drop an earlier run's records of them,
  // so each step is in the logs once (the history replaces a step's record when it is re-run).
  if (const auto sinks = sinks_.find(job_id); sinks != sinks_.end()) {
    for (const auto& sink : sinks->second) {
      LogIfFailed(sink->StartRun(step), "dropping re-run steps from a job's logs");
    }
  }
  LogIfFailed(jobs_.TransitionTo(job_id, v1::JOB_STATE_RUNNING,
                                 step > 0 ? absl::StrCat("resumed after step ", step) : "running",
                                 clock_()),
              "running a job");
}

void JobRunner::OnNotice(const std::string& job_id, int64_t generation, const std::string& notice) {
  if (!Current(job_id, generation)) return;
  const absl::StatusOr<v1::Job> job = jobs_.Get(job_id);
  if (!job.ok()) return;
  // The transition logs it too.
  LogIfFailed(jobs_.TransitionTo(job_id, job->state(), SanitizeForDisplay(notice, 2000), clock_()),
              "recording a job's notice");
}

void JobRunner::RecordProgress(const std::string& job_id, const v1::JobProgress& progress) {
  LogIfFailed(jobs_.Update(
                  job_id,
                  [&](v1::Job& record) {
                    const int32_t restarts = record.progress().restarts();
                    const auto causes = record.progress().restart_causes();
                    *record.mutable_progress() = progress;
                    record.mutable_progress()->set_restarts(restarts);
                    *record.mutable_progress()->mutable_restart_causes() = causes;
                  },
                  clock_()),
              "recording a job's progress");
}

void JobRunner::OnStep(const std::string& job_id, int64_t generation, const v1::StepMetrics& step,
                       const v1::JobProgress& progress) {
  if (!Current(job_id, generation)) return;
  // The history first: a step the job record counts is a step the history holds.
  LogIfFailed(history_.Put(job_id, step), "recording a step's metrics");
  if (const auto sinks = sinks_.find(job_id); sinks != sinks_.end()) {
    for (const auto& sink : sinks->second) LogIfFailed(sink->Write(step), "logging a step");
  }
  RecordProgress(job_id, progress);
  jobs_.PublishStep(job_id, step);
}

void JobRunner::OnFinished(const std::string& job_id, int64_t generation,
                           const absl::Status& status, bool fault,
                           const std::vector<std::string>& unanswered) {
  stopping_.erase(generation);  // a cancelled run's clean-up is over
  if (!Current(job_id, generation)) return;
  running_.erase(job_id);  // joins the driver's thread, which is returning
  sinks_.erase(job_id);
  if (!status.ok() && fault) {
    avoided_[job_id].insert(unanswered.begin(), unanswered.end());
  } else {
    avoided_.erase(job_id);
  }
  if (status.ok()) {
    const absl::StatusOr<v1::Job> job = jobs_.Get(job_id);
    LogIfFailed(
        jobs_.TransitionTo(
            job_id, v1::JOB_STATE_SUCCEEDED,
            absl::StrCat("finished ", job.ok() ? job->progress().current_step() : 0, " steps"),
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
    LogIfFailed(jobs_.Update(
                    job_id, [](v1::Job& record) { record.clear_placement(); }, clock_()),
                "recording a restart");
    LogIfFailed(jobs_.TransitionTo(job_id, v1::JOB_STATE_RECOVERING, shown, clock_()),
                "recovering a job");
    return;
  }
  if (restarts >= job->spec().trainer().max_restarts()) {
    faulted_at_.erase(job_id);
    avoided_.erase(job_id);
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
  LogIfFailed(jobs_.Update(
                  job_id,
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
  avoided_.erase(job_id);
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
      if (std::find(running.workers.begin(), running.workers.end(), lost) !=
          running.workers.end()) {
        running.driver->Cancel(absl::UnavailableError(
            absl::StrCat("worker ", lost, " was lost (no heartbeat within the liveness window)")));
        break;
      }
    }
  }
}

}  // namespace rlhfd::controller
