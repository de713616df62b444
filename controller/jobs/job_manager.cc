// Job submission, lookup, cancellation and events.
#include "controller/jobs/job_manager.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "common/config/job_validator.h"
#include "common/jobs/job_states.h"
#include "common/logging/logging.h"
#include "common/status/status_macros.h"
#include "common/util/text.h"
#include "controller/jobs/submit_checks.h"

namespace rlhfd::controller {
namespace {

// A config larger than this is not a config.
constexpr size_t kMaxConfigBytes = 1 << 20;
// Config names are file names, shown in every error and kept with the job.
constexpr size_t kMaxConfigNameBytes = 256;

std::string NoSuchJob(const std::string& job_id) {
  return absl::StrCat("no job '", SanitizeForDisplay(job_id, 64),
                      "'; job ids look like job-12 (see `rlhfctl jobs`)");
}

v1::JobEvent StateEvent(const v1::Job& job) {
  v1::JobEvent event;
  event.set_job_id(job.job_id());
  event.set_state(job.state());
  event.set_message(job.message());
  event.set_time_ms(job.update_time_ms());
  return event;
}

}  // namespace

void JobManager::Remember(int64_t number, const v1::Job& job) {
  JobSummary summary{.state = job.state(),
                     .priority = job.spec().trainer().priority(),
                     .name = job.spec().name(),
                     .need = NeedOf(job.spec())};
  Index(number, summary);
  jobs_.emplace(number, std::move(summary));
}

JobManager::JobManager(JobStore store) : store_(std::move(store)) {
  const absl::Status loaded = store_.ForEach([this](v1::Job job) {
    int64_t number = 0;
    if (!ParseJobId(job.job_id(), &number)) return;
    Remember(number, job);
  });
  if (!loaded.ok()) RLOG(ERROR) << "job store: " << loaded.message();
  if (!jobs_.empty()) RLOG(INFO) << "job store: loaded " << jobs_.size() << " jobs";
}

void JobManager::Index(int64_t number, const JobSummary& summary) {
  if (IsWaiting(summary.state)) queue_.emplace(-summary.priority, number);
  if (!IsTerminal(summary.state)) live_by_name_[summary.name].insert(number);
}

void JobManager::Unindex(int64_t number, const JobSummary& summary) {
  queue_.erase({-summary.priority, number});
  if (auto named = live_by_name_.find(summary.name); named != live_by_name_.end()) {
    named->second.erase(number);
    if (named->second.empty()) live_by_name_.erase(named);
  }
}

absl::StatusOr<JobManager::Submission> JobManager::Prepare(const v1::SubmitJobRequest& request) {
  if (request.config_name().size() > kMaxConfigNameBytes || !IsValidUtf8(request.config_name()) ||
      FirstControlCharacter(request.config_name()) >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config_name must be a file name of at most ", kMaxConfigNameBytes,
        " bytes of UTF-8 without control characters (got ", request.config_name().size(),
        " bytes: '", SanitizeForDisplay(request.config_name(), 64), "')"));
  }
  Submission submission;
  submission.source = request.config_name().empty() ? "request" : request.config_name();
  const std::string& source = submission.source;
  if (request.base_dir().size() > 4096 || !IsValidUtf8(request.base_dir()) ||
      FirstControlCharacter(request.base_dir()) >= 0) {
    return absl::InvalidArgumentError("base_dir must be a directory path of UTF-8 text");
  }
  if (request.config_text().size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": config is ", request.config_text().size(), " bytes; at most ", kMaxConfigBytes));
  }
  if (!request.config_text().empty() && request.has_spec()) {
    return absl::InvalidArgumentError("SubmitJob takes config_text or spec, not both");
  }
  if (request.has_spec() && request.spec().ByteSizeLong() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": spec is larger than ", kMaxConfigBytes, " bytes"));
  }
  if (request.has_spec() && request.overrides_size() > 0) {
    return absl::InvalidArgumentError("overrides apply to config_text, not to spec");
  }
  const std::vector<std::string> overrides(request.overrides().begin(), request.overrides().end());
  absl::StatusOr<v1::JobSpec> spec;
  if (!request.config_text().empty() || !overrides.empty()) {
    // The config's problems and its files' in one answer: the files of a config with errors are
    // checked too, so that fixing one problem does not reveal the next.
    config::ConfigErrors problems(source);
    std::optional<config::LoadedConfig> loaded =
        config::LoadConfigCollectingErrors(request.config_text(), source, overrides, &problems);
    if (loaded) {
      // Files are checked here, at once, rather than by a worker hours later.
      ResolveAndCheckFiles(request.base_dir(), &loaded->spec, &problems);
    }
    if (absl::Status status = problems.ToStatus(); !status.ok()) {
      spec = status;
    } else {
      spec = std::move(loaded->spec);
    }
  } else if (request.has_spec()) {
    spec = config::CompleteJobSpec(request.spec(), source);
    if (spec.ok()) {
      config::ConfigErrors problems(source);
      ResolveAndCheckFiles(request.base_dir(), &*spec, &problems);
      if (absl::Status status = problems.ToStatus(); !status.ok()) spec = status;
    }
  } else {
    spec = absl::InvalidArgumentError("SubmitJob needs config_text (a YAML/JSON config) or spec");
  }
  if (!spec.ok()) {
    RLOG(INFO) << "job refused: " << SanitizeForDisplay(spec.status().message(), 500);
    return spec.status();
  }
  submission.spec = *std::move(spec);
  return submission;
}

absl::StatusOr<v1::Job> JobManager::Submit(const v1::SubmitJobRequest& request, int64_t now_ms) {
  ASSIGN_OR_RETURN(Submission submission, Prepare(request));
  return Submit(std::move(submission), now_ms);
}

absl::StatusOr<v1::Job> JobManager::Submit(Submission submission, int64_t now_ms) {
  v1::Job job;
  *job.mutable_spec() = std::move(submission.spec);
  job.set_source(std::move(submission.source));
  job.set_submit_time_ms(now_ms);
  // A valid submission is queued at once; placement arrives with the scheduler.
  job.set_state(v1::JOB_STATE_QUEUED);
  job.set_message("waiting for placement");
  job.set_update_time_ms(now_ms);
  RETURN_IF_ERROR(store_.Insert(&job));
  int64_t number = 0;
  ParseJobId(job.job_id(), &number);
  Remember(number, job);
  RLOG(INFO) << "job " << job.job_id() << " (" << job.spec().name() << ") queued from "
             << job.source();
  return job;
}

JobSummary* JobManager::Find(const std::string& job_id, int64_t* number) {
  return const_cast<JobSummary*>(std::as_const(*this).Find(job_id, number));
}

const JobSummary* JobManager::Find(const std::string& job_id, int64_t* number) const {
  if (!ParseJobId(job_id, number)) return nullptr;
  auto it = jobs_.find(*number);
  return it == jobs_.end() ? nullptr : &it->second;
}

const JobSummary* JobManager::Summary(const std::string& job_id) const {
  int64_t number = 0;
  return Find(job_id, &number);
}

absl::StatusOr<v1::Job> JobManager::Read(int64_t number, const JobSummary& summary) const {
  ASSIGN_OR_RETURN(v1::Job job, store_.Get(number));
  if (IsWaiting(summary.state) && !summary.waiting_reason.empty()) {
    job.set_message(summary.waiting_reason);
  }
  return job;
}

absl::StatusOr<v1::Job> JobManager::Get(const std::string& job_id) const {
  int64_t number = 0;
  const JobSummary* summary = Find(job_id, &number);
  if (summary == nullptr) return absl::NotFoundError(NoSuchJob(job_id));
  return Read(number, *summary);
}

absl::Status JobManager::Delete(const std::string& job_id) {
  int64_t number = 0;
  const JobSummary* summary = Find(job_id, &number);
  if (summary == nullptr) return absl::NotFoundError(NoSuchJob(job_id));
  if (!IsTerminal(summary->state)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is ", v1::JobState_Name(summary->state),
                     "; cancel it first (rlhfctl cancel ", job_id, ")"));
  }
  RETURN_IF_ERROR(store_.Remove(number));
  Unindex(number, *summary);
  jobs_.erase(number);
  RLOG(INFO) << "job " << job_id << " deleted";
  return absl::OkStatus();
}

std::vector<std::string> JobManager::Warnings(const v1::JobSpec& spec,
                                              int64_t workers_registered) const {
  std::vector<std::string> warnings;
  if (std::string slow = SlowRolloutWarning(spec); !slow.empty()) warnings.push_back(slow);
  const int needed = config::TotalGpus(spec);
  if (needed > workers_registered) {
    warnings.push_back(absl::StrCat("the job needs ", needed, " workers (one per GPU) and ",
                                    workers_registered,
                                    " are registered: it stays queued until more register"));
  }
  constexpr size_t kNamedJobs = 3;
  if (const auto named = live_by_name_.find(spec.name()); named != live_by_name_.end()) {
    size_t listed = 0;
    for (const int64_t number : named->second) {
      if (listed++ == kNamedJobs) {
        const size_t more = named->second.size() - kNamedJobs;
        warnings.push_back(absl::StrCat(
            "and ", more,
            more == 1 ? " more job that has not ended has" : " more jobs that have not ended have",
            " the same name, '", spec.name(), "'"));
        break;
      }
      warnings.push_back(absl::StrCat("job ", JobId(number), " (",
                                      v1::JobState_Name(jobs_.at(number).state),
                                      ") has the same name, '", spec.name(), "'"));
    }
  }
  return warnings;
}

absl::StatusOr<JobPage> JobManager::List(const JobQuery& query) const {
  JobPage page;
  size_t bytes = 0;
  for (auto it = jobs_.upper_bound(query.after_number); it != jobs_.end(); ++it) {
    const auto& [number, summary] = *it;
    if (!query.states.empty() &&
        std::find(query.states.begin(), query.states.end(), summary.state) == query.states.end()) {
      continue;
    }
    const bool full =
        (query.page_size > 0 && static_cast<int>(page.jobs.size()) >= query.page_size) ||
        (query.max_bytes > 0 && !page.jobs.empty() && bytes >= query.max_bytes);
    if (full) {
      page.more = true;
      break;
    }
    ASSIGN_OR_RETURN(v1::Job job, Read(number, summary));
    bytes += job.ByteSizeLong();
    page.jobs.push_back(std::move(job));
    page.last_number = number;
  }
  return page;
}

absl::StatusOr<v1::Job> JobManager::Cancel(const std::string& job_id, int64_t now_ms) {
  RETURN_IF_ERROR(TransitionTo(job_id, v1::JOB_STATE_CANCELLED, "cancelled by user", now_ms));
  return Get(job_id);
}

absl::Status JobManager::Transition(v1::Job job, v1::JobState state, const std::string& message,
                                    int64_t now_ms) {
  int64_t number = 0;
  JobSummary* summary = Find(job.job_id(), &number);
  if (summary == nullptr) return absl::NotFoundError(NoSuchJob(job.job_id()));
  job.set_state(state);
  job.set_message(message);
  job.set_update_time_ms(now_ms);
  RETURN_IF_ERROR(store_.Put(job));
  Unindex(number, *summary);
  summary->state = state;
  summary->waiting_reason.clear();
  Index(number, *summary);
  RLOG(INFO) << "job " << job.job_id() << " -> " << v1::JobState_Name(state) << ": " << message;
  const v1::JobEvent event = StateEvent(job);
  // A sink may Unwatch while we iterate; copy the matching sinks first.
  std::vector<EventSink> sinks;
  for (const auto& [id, watcher] : watchers_) {
    if (watcher.job_id == job.job_id()) sinks.push_back(watcher.sink);
  }
  for (const EventSink& sink : sinks) sink(event);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> JobManager::Watch(const std::string& job_id, EventSink sink) {
  ASSIGN_OR_RETURN(const v1::Job job, Get(job_id));
  sink(StateEvent(job));
  const int64_t subscription = next_subscription_++;
  watchers_.emplace(subscription, Watcher{job_id, std::move(sink)});
  return subscription;
}

void JobManager::Unwatch(int64_t subscription) { watchers_.erase(subscription); }

absl::Status JobManager::TransitionTo(const std::string& job_id, v1::JobState state,
                                      const std::string& message, int64_t now_ms) {
  int64_t number = 0;
  const JobSummary* summary = Find(job_id, &number);
  if (summary == nullptr) return absl::NotFoundError(NoSuchJob(job_id));
  if (IsTerminal(summary->state)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " already ended (", v1::JobState_Name(summary->state), ")"));
  }
  ASSIGN_OR_RETURN(v1::Job job, store_.Get(number));
  return Transition(std::move(job), state, message, now_ms);
}

absl::Status JobManager::Update(const std::string& job_id,
                                const std::function<void(v1::Job&)>& change, int64_t now_ms) {
  int64_t number = 0;
  if (Find(job_id, &number) == nullptr) return absl::NotFoundError(NoSuchJob(job_id));
  ASSIGN_OR_RETURN(v1::Job job, store_.Get(number));
  change(job);
  job.set_update_time_ms(now_ms);
  return store_.Put(job);
}

void JobManager::SetWaitingReason(const std::string& job_id, std::string reason) {
  int64_t number = 0;
  JobSummary* summary = Find(job_id, &number);
  if (summary != nullptr && summary->waiting_reason != reason) {
    summary->waiting_reason = std::move(reason);
  }
}

std::vector<std::string> JobManager::Waiting() const {
  std::vector<std::string> ids;
  ids.reserve(queue_.size());
  for (const auto& [priority, number] : queue_) ids.push_back(JobId(number));
  return ids;
}

void JobManager::PublishStep(const std::string& job_id, const v1::StepMetrics& step) {
  const JobSummary* job = Summary(job_id);
  if (job == nullptr) return;
  v1::JobEvent event;
  event.set_job_id(job_id);
  event.set_state(job->state);
  event.set_time_ms(step.time_ms());
  event.set_step(step.step());
  *event.mutable_metrics() = step.metrics();
  std::vector<EventSink> sinks;
  for (const auto& [id, watcher] : watchers_) {
    if (watcher.job_id == job_id) sinks.push_back(watcher.sink);
  }
  for (const EventSink& sink : sinks) sink(event);
}

std::map<std::string, int32_t> JobManager::CountByState() const {
  std::map<std::string, int32_t> counts;
  for (const auto& [number, job] : jobs_) ++counts[v1::JobState_Name(job.state)];
  return counts;
}

}  // namespace rlhfd::controller
