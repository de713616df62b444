// Controller logic; see controller.h.
#include "controller/controller.h"

#include <algorithm>
#include <map>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging/logging.h"
#include "common/rpc/pending_unary.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"

namespace rlhfd::controller {

absl::StatusOr<std::unique_ptr<Controller>> Controller::Create(const ControllerOptions& options,
                                                               Clock clock) {
  if (options.state_dir.empty()) {
    return absl::InvalidArgumentError("--state_dir is required: where the controller keeps jobs");
  }
  if (options.liveness.liveness_window <= options.liveness.heartbeat_interval) {
    return absl::InvalidArgumentError(
        "--liveness_window must be longer than --heartbeat_interval (3x or more is sensible)");
  }
  // The state directory holds the cluster token and every job's config: owner only.
  RETURN_IF_ERROR(MakePrivateDirectory(options.state_dir));
  ASSIGN_OR_RETURN(JobStore store, JobStore::Open(options.state_dir));
  ASSIGN_OR_RETURN(DrainStore drains, DrainStore::Open(options.state_dir));
  ASSIGN_OR_RETURN(std::unique_ptr<MetricHistory> history,
                   OpenSqliteMetricHistory(options.state_dir + "/metrics.db"));
  return std::unique_ptr<Controller>(new Controller(options, std::move(clock), std::move(store),
                                                    std::move(drains), std::move(history)));
}

Controller::Controller(ControllerOptions options, Clock clock, JobStore store, DrainStore drains,
                       std::unique_ptr<MetricHistory> history)
    : options_(std::move(options)),
      clock_(std::move(clock)),
      start_time_ms_(clock_()),
      drains_(std::move(drains)),
      workers_(options_.liveness, drains_.drained()),
      jobs_(std::move(store)),
      history_(std::move(history)) {}

void Controller::StartRunner(JobRunner::Poster post, RunnerOptions options) {
  runner_ = std::make_unique<JobRunner>(jobs_, workers_, *history_, std::move(post),
                                        std::move(options), clock_);
  runner_->RecoverAfterRestart();
  runner_->Schedule();
}

void Controller::StopRunner() {
  if (runner_) runner_->Shutdown();
}

void Controller::Schedule() {
  if (runner_) runner_->Schedule();
}

void Controller::Tick() {
  SweepLiveness();
  Schedule();
}

void Controller::GetJobMetricsAsync(
    EventLoop& loop, const v1::GetJobMetricsRequest& request,
    std::function<void(absl::StatusOr<v1::GetJobMetricsReply>)> done) {
  loop.Post([this, request, done = std::move(done)]() mutable {
    const absl::Status found =
        CatchAll<v1::Job>("GetJobMetrics", [&] { return jobs_.Get(request.job_id()); }).status();
    if (!found.ok()) return done(found);
    history_reads_.Post([this, request, done = std::move(done)] {
      done(CatchAll<v1::GetJobMetricsReply>(
          "GetJobMetrics", [&]() -> absl::StatusOr<v1::GetJobMetricsReply> {
            ASSIGN_OR_RETURN(std::vector<v1::StepMetrics> steps,
                             history_->Get(request.job_id(), request.after_step()));
            v1::GetJobMetricsReply reply;
            for (v1::StepMetrics& step : steps) *reply.add_steps() = std::move(step);
            return reply;
          }));
    });
  });
}

void Controller::GetJobSamplesAsync(
    EventLoop& loop, const v1::GetJobSamplesRequest& request,
    std::function<void(absl::StatusOr<v1::GetJobSamplesReply>)> done) {
  loop.Post([this, request, done = std::move(done)]() mutable {
    const absl::Status found =
        CatchAll<v1::Job>("GetJobSamples", [&] { return jobs_.Get(request.job_id()); }).status();
    if (!found.ok()) return done(found);
    history_reads_.Post([this, request, done = std::move(done)] {
      done(CatchAll<v1::GetJobSamplesReply>(
          "GetJobSamples", [&]() -> absl::StatusOr<v1::GetJobSamplesReply> {
            ASSIGN_OR_RETURN(std::vector<v1::StepMetrics> steps,
                             history_->GetSamples(request.job_id(), request.after_step()));
            v1::GetJobSamplesReply reply;
            for (v1::StepMetrics& step : steps) *reply.add_steps() = std::move(step);
            return reply;
          }));
    });
  });
}

absl::StatusOr<v1::SubmitJobReply> Controller::SubmitJob(const v1::SubmitJobRequest& request) {
  ASSIGN_OR_RETURN(JobManager::Submission submission, JobManager::Prepare(request));
  return SubmitPrepared(std::move(submission));
}

void Controller::SubmitJobAsync(EventLoop& loop, const v1::SubmitJobRequest& request,
                                std::function<void(absl::StatusOr<v1::SubmitJobReply>)> done) {
  absl::StatusOr<JobManager::Submission> prepared =
      CatchAll<JobManager::Submission>("SubmitJob", [&] { return JobManager::Prepare(request); });
  if (!prepared.ok()) return done(prepared.status());
  loop.Post([this, submission = *std::move(prepared), done = std::move(done)]() mutable {
    done(CatchAll<v1::SubmitJobReply>("SubmitJob",
                                      [&] { return SubmitPrepared(std::move(submission)); }));
  });
}

absl::StatusOr<v1::SubmitJobReply> Controller::SubmitPrepared(JobManager::Submission submission) {
  v1::SubmitJobReply reply;
  int64_t registered = 0;
  for (const v1::Worker& worker : workers_.List()) {
    registered += worker.state() != v1::WORKER_STATE_LOST ? 1 : 0;
  }
  for (std::string& warning : jobs_.Warnings(submission.spec, registered)) {
    reply.add_warnings(std::move(warning));
  }
  ASSIGN_OR_RETURN(*reply.mutable_job(), jobs_.Submit(std::move(submission), clock_()));
  if (runner_) runner_->Submitted(reply.job().job_id());
  // Re-read: the runner may have placed it.
  if (const auto placed = jobs_.Get(reply.job().job_id()); placed.ok()) {
    *reply.mutable_job() = *placed;
  }
  return reply;
}

absl::StatusOr<v1::DeleteJobReply> Controller::DeleteJob(const v1::DeleteJobRequest& request) {
  RETURN_IF_ERROR(jobs_.Delete(request.job_id()));
  if (absl::Status removed = history_->Remove(request.job_id()); !removed.ok()) {
    RLOG(WARNING) << "job " << request.job_id() << ": " << removed.message();
  }
  return v1::DeleteJobReply();
}

absl::StatusOr<v1::GetJobReply> Controller::GetJob(const v1::GetJobRequest& request) {
  v1::GetJobReply reply;
  ASSIGN_OR_RETURN(*reply.mutable_job(), jobs_.Get(request.job_id()));
  return reply;
}

namespace {

// ListJobs pages (AIP-158): a default and a maximum page size, and about this many bytes of jobs
// at most in a reply (a job holds a config of up to 1 MiB), well under a client's default 4 MiB
// message limit.
constexpr int kDefaultPageSize = 100;
constexpr int kMaxPageSize = 1000;
constexpr size_t kMaxPageBytes = 2 << 20;
constexpr char kPageTokenVersion[] = "p1";

// A page token is opaque to clients: the last job number listed and the states asked for,
// base64. The states are checked, so a token is never used for a listing it was not made for.
std::string PageToken(int64_t after_number, uint64_t states) {
  return absl::WebSafeBase64Escape(absl::StrCat(kPageTokenVersion, ".", after_number, ".", states));
}

absl::StatusOr<int64_t> ParsePageToken(const std::string& token, uint64_t states) {
  const absl::Status bad = absl::InvalidArgumentError(
      "page_token: not a token this controller gave for these states; pass the "
      "next_page_token of the previous reply unchanged, with the same states, or none for the "
      "first page");
  std::string text;
  if (token.size() > 100 || !absl::WebSafeBase64Unescape(token, &text)) return bad;
  const std::vector<std::string> parts = absl::StrSplit(text, '.');
  int64_t after = 0;
  uint64_t token_states = 0;
  if (parts.size() != 3 || parts[0] != kPageTokenVersion || !absl::SimpleAtoi(parts[1], &after) ||
      after < 0 || !absl::SimpleAtoi(parts[2], &token_states) || token_states != states) {
    return bad;
  }
  return after;
}

}  // namespace

absl::StatusOr<v1::ListJobsReply> Controller::ListJobs(const v1::ListJobsRequest& request) {
  if (request.states_size() > v1::JobState_ARRAYSIZE) {
    return absl::InvalidArgumentError(
        absl::StrCat("ListJobs takes at most ", v1::JobState_ARRAYSIZE, " states"));
  }
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: ", request.page_size(), " is negative; give 1 to ", kMaxPageSize,
                     ", or 0 for the default (", kDefaultPageSize, ")"));
  }
  JobQuery query;
  uint64_t states = 0;  // a bit per state asked for
  for (int state : request.states()) {
    if (state < 0 || state >= 64) {
      return absl::InvalidArgumentError(absl::StrCat("states: ", state, " is not a job state"));
    }
    states |= uint64_t{1} << state;
    query.states.push_back(static_cast<v1::JobState>(state));
  }
  if (!request.page_token().empty()) {
    ASSIGN_OR_RETURN(query.after_number, ParsePageToken(request.page_token(), states));
  }
  query.page_size =
      request.page_size() == 0 ? kDefaultPageSize : std::min(request.page_size(), kMaxPageSize);
  query.max_bytes = kMaxPageBytes;
  ASSIGN_OR_RETURN(JobPage page, jobs_.List(query));
  v1::ListJobsReply reply;
  for (v1::Job& job : page.jobs) *reply.add_jobs() = std::move(job);
  if (page.more) reply.set_next_page_token(PageToken(page.last_number, states));
  return reply;
}

absl::StatusOr<std::vector<v1::Job>> Controller::AllJobsIn(
    const std::vector<v1::JobState>& states) {
  JobQuery query;
  query.states = states;
  ASSIGN_OR_RETURN(JobPage page, jobs_.List(query));
  return std::move(page.jobs);
}

absl::StatusOr<v1::CancelJobReply> Controller::CancelJob(const v1::CancelJobRequest& request) {
  v1::CancelJobReply reply;
  ASSIGN_OR_RETURN(*reply.mutable_job(), jobs_.Cancel(request.job_id(), clock_()));
  if (runner_) runner_->Cancelled(request.job_id());
  return reply;
}

absl::StatusOr<int64_t> Controller::WatchJob(const v1::WatchJobRequest& request,
                                             JobManager::EventSink sink) {
  return jobs_.Watch(request.job_id(), std::move(sink));
}

void Controller::UnwatchJob(int64_t subscription) { jobs_.Unwatch(subscription); }

absl::StatusOr<v1::ListWorkersReply> Controller::ListWorkers(const v1::ListWorkersRequest&) {
  v1::ListWorkersReply reply;
  // The registry knows workers; which job each runs is the runner's (its placements).
  const std::map<std::string, std::string> jobs =
      runner_ ? runner_->WorkerJobs() : std::map<std::string, std::string>();
  for (v1::Worker& worker : workers_.List()) {
    if (const auto job = jobs.find(worker.worker_id()); job != jobs.end()) {
      worker.set_job_id(job->second);
    }
    *reply.add_workers() = std::move(worker);
  }
  return reply;
}

absl::StatusOr<v1::GetClusterReply> Controller::GetCluster(const v1::GetClusterRequest&) {
  v1::GetClusterReply reply;
  for (const v1::Worker& worker : workers_.List()) {
    switch (worker.state()) {
      case v1::WORKER_STATE_ALIVE:
        reply.set_workers_alive(reply.workers_alive() + 1);
        if (worker.capacity().device_kind() == v1::DEVICE_KIND_CUDA) {
          reply.set_gpus_alive(reply.gpus_alive() + 1);
        }
        break;
      case v1::WORKER_STATE_LOST:
        reply.set_workers_lost(reply.workers_lost() + 1);
        break;
      case v1::WORKER_STATE_DRAINING:
        reply.set_workers_draining(reply.workers_draining() + 1);
        break;
      default:
        break;
    }
  }
  for (const auto& [state, count] : jobs_.CountByState()) {
    (*reply.mutable_jobs_by_state())[state] = count;
  }
  reply.set_controller_start_time_ms(start_time_ms_);
  reply.set_controller_version(options_.version);
  return reply;
}

absl::StatusOr<v1::DrainWorkerReply> Controller::DrainWorker(
    const v1::DrainWorkerRequest& request) {
  v1::DrainWorkerReply reply;
  if (workers_.Contains(request.worker_id())) {
    // Durable before it is acknowledged.
    std::set<std::string> drained = workers_.drained();
    drained.insert(request.worker_id());
    RETURN_IF_ERROR(drains_.Save(drained));
  }
  ASSIGN_OR_RETURN(*reply.mutable_worker(), workers_.Drain(request.worker_id()));
  return reply;
}

absl::StatusOr<v1::UndrainWorkerReply> Controller::UndrainWorker(
    const v1::UndrainWorkerRequest& request) {
  v1::UndrainWorkerReply reply;
  if (workers_.drained().count(request.worker_id())) {
    std::set<std::string> drained = workers_.drained();
    drained.erase(request.worker_id());
    RETURN_IF_ERROR(drains_.Save(drained));
  }
  ASSIGN_OR_RETURN(*reply.mutable_worker(), workers_.Undrain(request.worker_id()));
  Schedule();
  return reply;
}

absl::StatusOr<v1::RegisterWorkerReply> Controller::RegisterWorker(
    const v1::RegisterWorkerRequest& request) {
  absl::StatusOr<v1::RegisterWorkerReply> reply = workers_.Register(request, clock_());
  if (!reply.ok()) return reply;
  reply->set_stage_token(options_.stage_token);
  Schedule();
  return reply;
}

absl::StatusOr<v1::HeartbeatReply> Controller::Heartbeat(const v1::HeartbeatRequest& request) {
  absl::StatusOr<v1::HeartbeatReply> reply = workers_.Heartbeat(request, clock_());
  if (reply.ok() && runner_) {
    for (const v1::JobAttempt& hosted : request.hosted()) {
      if (runner_->MovedOn(request.worker_id(), hosted)) *reply->add_end() = hosted;
    }
  }
  return reply;
}

void Controller::SweepLiveness() {
  const std::vector<std::string> lost = workers_.SweepLiveness(clock_());
  if (!lost.empty() && runner_) runner_->WorkersLost(lost);
}

}  // namespace rlhfd::controller
