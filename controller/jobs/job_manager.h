// JobManager: the controller's jobs and their lifecycle. It validates submissions with the
// config loader, persists every change through JobStore before acknowledging it, and tells
// watchers about each transition. Lives on the controller's event loop (not thread-safe).
//
// Memory: a job's record (its spec above all) lives in the store and is read when asked for; the
// manager keeps a few hundred bytes per job (JobSummary) and the indexes a submission and a
// scheduling pass need (the queue in placement order, live jobs by name, counts by state), so
// memory per job stays below the job's size on disk and a submission costs O(log n) plus one
// store transaction.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/scheduler/scheduler.h"
#include "controller/store/job_store.h"
#include "rlhfd/v1/job_service.pb.h"

namespace rlhfd::controller {

// What the manager keeps of a job between reads of its record.
struct JobSummary {
  v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
  int32_t priority = 0;  // trainer.priority
  std::string name;      // spec.name
  PlacementNeed need;
  // Why a waiting job waits ("waiting for workers: ..."), set by the scheduler. Not persisted:
  // it follows from the cluster of the moment (a restarted controller works it out again), and
  // persisting it would rewrite every waiting job's record whenever a worker comes or goes. A
  // read of a waiting job shows it as the job's message.
  std::string waiting_reason;
};

// One page of a listing: `states` (all when empty), jobs numbered above `after_number`, oldest
// first; at most `page_size` jobs (0: no bound) and, past the first job, no more than about
// `max_bytes` of records (0: no bound).
struct JobQuery {
  std::vector<v1::JobState> states;
  int64_t after_number = 0;
  int page_size = 0;
  size_t max_bytes = 0;
};
struct JobPage {
  std::vector<v1::Job> jobs;
  // The number of the last job in `jobs`; whether jobs matching the query follow it.
  int64_t last_number = 0;
  bool more = false;
};

class JobManager {
 public:
  // Receives events on the event loop; must not block.
  using EventSink = std::function<void(const v1::JobEvent&)>;

  // Loads every job the store holds.
  explicit JobManager(JobStore store);

  // A submission checked and parsed: bounded work that needs none of the manager's state, so it
  // runs on the calling RPC thread and never stalls the event loop.
  struct Submission {
    v1::JobSpec spec;
    std::string source;
  };
  // Checks the request's fields, parses the config (text with its overrides, or a spec),
  // validates it, resolves its relative paths against request.base_dir and checks its model and
  // data files. INVALID_ARGUMENT lists each problem with its file and key. Thread-safe.
  static absl::StatusOr<Submission> Prepare(const v1::SubmitJobRequest& request);

  // Stores the job and queues it.
  absl::StatusOr<v1::Job> Submit(Submission submission, int64_t now_ms);
  // Prepare, then Submit.
  absl::StatusOr<v1::Job> Submit(const v1::SubmitJobRequest& request, int64_t now_ms);

  // The job's record, read from the store.
  absl::StatusOr<v1::Job> Get(const std::string& job_id) const;
  // Whether the job is in the store (in any state).
  bool Contains(const std::string& job_id) const { return Summary(job_id) != nullptr; }

  // A page of jobs (JobQuery); records are read from the store.
  absl::StatusOr<JobPage> List(const JobQuery& query) const;

  // Ends a job that has not ended. FAILED_PRECONDITION for a finished job.
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id, int64_t now_ms);

  // Forgets an ended job. FAILED_PRECONDITION for a job that has not ended.
  absl::Status Delete(const std::string& job_id);

  // What to tell the submitter of `spec` without refusing it: a job larger than the
  // `workers_registered` workers, a name other live jobs have (the oldest few by id, then how
  // many more: a reply does not grow with the queue).
  std::vector<std::string> Warnings(const v1::JobSpec& spec, int64_t workers_registered) const;

  // Sends `sink` the job's current state now and every later event of the job. Returns the
  // subscription for Unwatch.
  absl::StatusOr<int64_t> Watch(const std::string& job_id, EventSink sink);
  void Unwatch(int64_t subscription);

  // Number of jobs per state name.
  std::map<std::string, int32_t> CountByState() const;

  // The scheduler's view. Waiting: the QUEUED and RECOVERING jobs in placement order (higher
  // trainer.priority first, then oldest first). Summary: what is kept of a job (nullptr for an
  // unknown id). SetWaitingReason: why a waiting job waits (in memory only; see JobSummary).
  std::vector<std::string> Waiting() const;
  const JobSummary* Summary(const std::string& job_id) const;
  void SetWaitingReason(const std::string& job_id, std::string reason);

  // The job runner's changes. TransitionTo moves a job that has not ended to `state` (persisted
  // first, then told to watchers); Update persists other changes of its record (progress,
  // placement, message) without an event; PublishStep tells watchers a step's metrics.
  absl::Status TransitionTo(const std::string& job_id, v1::JobState state,
                            const std::string& message, int64_t now_ms);
  absl::Status Update(const std::string& job_id, const std::function<void(v1::Job&)>& change,
                      int64_t now_ms);
  void PublishStep(const std::string& job_id, const v1::StepMetrics& step);

 private:
  // Persists the new state before it takes effect, then notifies watchers.
  absl::Status Transition(v1::Job job, v1::JobState state, const std::string& message,
                          int64_t now_ms);
  // Keeps the summary of stored job `number` and indexes it.
  void Remember(int64_t number, const v1::Job& job);
  // The summary of a known job id, with its number.
  JobSummary* Find(const std::string& job_id, int64_t* number);
  const JobSummary* Find(const std::string& job_id, int64_t* number) const;
  // The stored record of a known job, its waiting reason shown as its message.
  absl::StatusOr<v1::Job> Read(int64_t number, const JobSummary& summary) const;
  // Adds or removes a job from the indexes its summary places it in.
  void Index(int64_t number, const JobSummary& summary);
  void Unindex(int64_t number, const JobSummary& summary);

  struct Watcher {
    std::string job_id;
    EventSink sink;
  };

  JobStore store_;
  // Keyed by the number in "job-<n>", so iteration is submission order.
  std::map<int64_t, JobSummary> jobs_;
  // Waiting jobs as (-priority, number): iteration is placement order.
  std::set<std::pair<int32_t, int64_t>> queue_;
  // Jobs that have not ended, by name (for the same-name warning).
  std::map<std::string, std::set<int64_t>> live_by_name_;
  std::map<int64_t, Watcher> watchers_;
  int64_t next_subscription_ = 1;
};

}  // namespace rlhfd::controller
