// JobRunner: places waiting jobs on free workers (the scheduler), runs a driver per placed job,
// and turns what the drivers report into the jobs' states, progress and metric history:
// QUEUED → PLACING → STARTING → RUNNING → SUCCEEDED, or RECOVERING after a fault (placed again,
// resumed from the latest committed checkpoint, at most trainer.max_restarts times), FAILED for
// the job's own errors. Lives on the controller's event loop; drivers run on threads of their
// own and report back through `post`.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/rpc/grpc_options.h"
#include "controller/cluster/worker_registry.h"
#include "controller/driver/job_driver.h"
#include "controller/jobs/job_manager.h"
#include "controller/metrics/metric_sinks.h"
#include "controller/scheduler/scheduler.h"
#include "controller/store/metric_history.h"

namespace rlhfd::controller {

struct RunnerOptions {
  std::string token;  // the stage token (<state_dir>/stage_token), the only one workers accept
  RpcOptions rpc;
  absl::Duration stage_deadline = absl::Minutes(30);
  // Stage fan-outs to more ranks than this go through relaying workers (0: never;
  // JobStagesOptions::relay_above).
  int stage_relay_above = 64;
  int64_t communicator_timeout_ms = 300000;
  // Each job's metric sinks (trainer.loggers) write under <log_dir>/<job id>.
  std::string log_dir;
  // How long a checkpoint save waits for a full disk before its job fails.
  absl::Duration disk_full_timeout = absl::Minutes(10);
};

class JobRunner {
 public:
  // Runs a task on the event loop (from any thread).
  using Poster = std::function<void(std::function<void()>)>;
  using Clock = std::function<int64_t()>;

  JobRunner(JobManager& jobs, WorkerRegistry& workers, MetricHistory& history, Poster post,
            RunnerOptions options, Clock clock);
  // Stops every driver (Shutdown).
  ~JobRunner();

  // At start-up: the jobs a previous controller was running recover (placed again, resumed from
  // their latest committed checkpoint).
  void RecoverAfterRestart();
  // Places waiting jobs in the queue's order; call whenever workers or running jobs change.
  void Schedule();
  // Places a job just submitted if it can be: O(log n) in the waiting jobs, where a pass over
  // them (Schedule) is O(n).
  void Submitted(const std::string& job_id);
  // The user cancelled `job_id` (the manager has it CANCELLED): its driver stops, its workers
  // are free at once.
  void Cancelled(const std::string& job_id);
  // Workers the registry marked lost: the jobs using them recover.
  void WorkersLost(const std::vector<std::string>& worker_ids);
  // Controller shutdown: drivers stop, jobs keep their states (the next controller recovers
  // them).
  void Shutdown();
  // Whether `attempt`, which `worker_id` hosts, is one this controller no longer runs there: its
  // job's run moved on (a later attempt, other workers, or the job's end), or the job is not
  // known here (deleted after its end, or the controller's state directory was lost).
  bool MovedOn(const std::string& worker_id, const v1::JobAttempt& attempt) const;
  // The job each busy worker runs (worker id -> job id), as placement counts them busy.
  std::map<std::string, std::string> WorkerJobs() const;

 private:
  struct Running {
    std::unique_ptr<JobDriver> driver;
    std::vector<std::string> workers;
    int64_t generation = 0;
    int64_t attempt = 0;  // the job's (StageKey.attempt)
  };
  // A scheduling pass: the workers of the moment, the ones running jobs use, and the job that
  // could not be placed first (its priority and id): jobs of lower priority wait behind it.
  struct Pass {
    std::vector<v1::Worker> workers;
    std::map<std::string, std::string> used;
    std::optional<std::pair<int32_t, std::string>> held_back_by;
  };
  Pass BeginPass() const;
  // Places waiting job `id` if it fits, or records why it waits.
  void Consider(const std::string& id, Pass& pass);
  void Start(const v1::Job& job, const Placement& placement);
  void OnRunning(const std::string& job_id, int64_t generation, const v1::JobProgress& progress);
  // A driver's notice: logged, and a state event (same state, the notice as its message).
  void OnNotice(const std::string& job_id, int64_t generation, const std::string& notice);
  // Records the driver's `progress`, keeping the runner's own restart count and causes.
  void RecordProgress(const std::string& job_id, const v1::JobProgress& progress);
  void OnStep(const std::string& job_id, int64_t generation, const v1::StepMetrics& step,
              const v1::JobProgress& progress);
  // " (apart from W, ...)" naming the avoided_ workers `placement` leaves out; "" when none.
  std::string ApartFrom(const std::string& job_id, const Placement& placement) const;
  void OnFinished(const std::string& job_id, int64_t generation, const absl::Status& status,
                  bool fault, const std::vector<std::string>& unanswered);
  // Ends a faulted run: RECOVERING when a restart is left, else FAILED. A restart that `counts`
  // uses one of trainer.max_restarts.
  void Recover(const std::string& job_id, const std::string& cause, bool counts = true);
  bool Current(const std::string& job_id, int64_t generation) const;

  JobManager& jobs_;
  WorkerRegistry& workers_;
  MetricHistory& history_;
  Poster post_;
  RunnerOptions options_;
  Clock clock_;
  std::map<std::string, Running> running_;
  // The sinks of each running job.
  std::map<std::string, std::vector<std::unique_ptr<MetricSink>>> sinks_;
  // Drivers of cancelled runs finishing their clean-up, by generation.
  std::map<int64_t, std::unique_ptr<JobDriver>> stopping_;
  // When each recovering job's fault happened (controller clock): workers silent since then are
  // not placed for it.
  std::map<std::string, int64_t> faulted_at_;
  // Per job, the workers that left a stage of one of its runs unanswered past the deadline (a
  // hung or slow host): its later placements leave them out while enough others are free.
  std::map<std::string, std::set<std::string>> avoided_;
  // The last pass's held_back_by, for the jobs submitted after it.
  std::optional<std::pair<int32_t, std::string>> held_back_by_;
  int64_t next_generation_ = 1;
  bool shut_down_ = false;
};

}  // namespace rlhfd::controller
