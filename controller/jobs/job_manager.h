// JobManager: the controller's jobs and their lifecycle. It validates submissions with the
// config loader, persists every change through JobStore before acknowledging it, and tells
// watchers about each transition. Lives on the controller's event loop (not thread-safe).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/store/job_store.h"
#include "rlhfd/v1/job_service.pb.h"

namespace rlhfd::controller {

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

  absl::StatusOr<v1::Job> Get(const std::string& job_id) const;
  // Whether the job is in the store (in any state).
  bool Contains(const std::string& job_id) const { return Find(job_id) != nullptr; }

  // Oldest first; all states when `states` is empty.
  std::vector<v1::Job> List(const std::vector<v1::JobState>& states) const;

  // Ends a job that has not ended. FAILED_PRECONDITION for a finished job.
  absl::StatusOr<v1::Job> Cancel(const std::string& job_id, int64_t now_ms);

  // Forgets an ended job. FAILED_PRECONDITION for a job that has not ended.
  absl::Status Delete(const std::string& job_id);

  // What to tell the submitter of `spec` without refusing it: a job larger than the
  // `workers_registered` workers, a name another live job has.
  std::vector<std::string> Warnings(const v1::JobSpec& spec, int64_t workers_registered) const;

  // Sends `sink` the job's current state now and every later event of the job. Returns the
  // subscription for Unwatch.
  absl::StatusOr<int64_t> Watch(const std::string& job_id, EventSink sink);
  void Unwatch(int64_t subscription);

  // Number of jobs per state name.
  std::map<std::string, int32_t> CountByState() const;

  // The job runner's changes. TransitionTo moves a job that has not ended to `state` (persisted
  // first, then told to watchers); Update persists other changes of its record (progress,
  // placement, message) without an event; PublishStep tells watchers a step's metrics.
  absl::Status TransitionTo(const std::string& job_id, v1::JobState state,
                            const std::string& message, int64_t now_ms);
  absl::Status Update(const std::string& job_id, const std::function<void(v1::Job&)>& change,
                      int64_t now_ms);
  void PublishStep(const std::string& job_id, const v1::StepMetrics& step);

  static bool IsTerminal(v1::JobState state);

 private:
  // Persists the new state before it takes effect, then notifies watchers.
  absl::Status Transition(v1::Job* job, v1::JobState state, const std::string& message,
                          int64_t now_ms);
  const v1::Job* Find(const std::string& job_id) const;

  struct Watcher {
    std::string job_id;
    EventSink sink;
  };

  JobStore store_;
  // Keyed by the number in "job-<n>", so iteration is submission order.
  std::map<int64_t, v1::Job> jobs_;
  std::map<int64_t, Watcher> watchers_;
  int64_t next_subscription_ = 1;
};

}  // namespace rlhfd::controller
