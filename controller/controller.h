// Controller: the logic of rlhfd-controller as plain methods over proto messages. It owns the
// worker registry and the jobs; the gRPC services (controller/api) are thin adapters that run
// these methods on the controller's event loop, and tests call them directly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/util/event_loop.h"
#include "controller/cluster/worker_registry.h"
#include "controller/jobs/job_manager.h"
#include "controller/jobs/job_runner.h"
#include "controller/store/drain_store.h"
#include "controller/store/metric_history.h"
#include "rlhfd/v1/cluster_service.pb.h"
#include "rlhfd/v1/job_service.pb.h"
#include "rlhfd/v1/worker_service.pb.h"

namespace rlhfd::controller {

struct ControllerOptions {
  // Directory of the durable state (jobs, tokens); created if missing.
  std::string state_dir;
  // Handed to each worker that registers: the only token its stage API accepts.
  std::string stage_token;
  LivenessOptions liveness;
  std::string version = RLHFD_VERSION;
};

class Controller {
 public:
  // Milliseconds since the Unix epoch; injected so tests control time.
  using Clock = std::function<int64_t()>;

  static absl::StatusOr<std::unique_ptr<Controller>> Create(const ControllerOptions& options,
                                                            Clock clock);

  // JobService. SubmitJob = JobManager::Prepare (thread-safe) + SubmitPrepared (on the loop).
  absl::StatusOr<v1::SubmitJobReply> SubmitJob(const v1::SubmitJobRequest& request);
  absl::StatusOr<v1::SubmitJobReply> SubmitPrepared(JobManager::Submission submission);
  // SubmitJob as the API adapters (gRPC and REST alike) run it, from any thread: the config is
  // parsed and validated on the calling thread (bounded work that needs no controller state, so
  // a large config never holds up the loop); only storing it runs on `loop`, the loop that owns
  // this Controller. `done` runs once: on the loop, or at once on the calling thread when the
  // config is refused. What a call throws becomes INTERNAL.
  void SubmitJobAsync(EventLoop& loop, const v1::SubmitJobRequest& request,
                      std::function<void(absl::StatusOr<v1::SubmitJobReply>)> done);
  absl::StatusOr<v1::GetJobReply> GetJob(const v1::GetJobRequest& request);
  absl::StatusOr<v1::ListJobsReply> ListJobs(const v1::ListJobsRequest& request);
  // Every job in `states` (all when empty), unpaged, for in-process callers that need each one
  // (the gateway's /metrics asks for the jobs that run); not an RPC, whose replies are paged.
  absl::StatusOr<std::vector<v1::Job>> AllJobsIn(const std::vector<v1::JobState>& states);
  absl::StatusOr<v1::CancelJobReply> CancelJob(const v1::CancelJobRequest& request);
  absl::StatusOr<v1::DeleteJobReply> DeleteJob(const v1::DeleteJobRequest& request);
  absl::StatusOr<int64_t> WatchJob(const v1::WatchJobRequest& request, JobManager::EventSink sink);
  void UnwatchJob(int64_t subscription);
  // GetJobMetrics as the API adapters run it, from any thread: the job is looked up on `loop`
  // (the loop that owns this Controller), and its history, which may be long, is read on a
  // thread of the Controller's own (the store is thread-safe), so the loop never waits on it.
  // `done` runs once, on either. What a call throws becomes INTERNAL.
  void GetJobMetricsAsync(EventLoop& loop, const v1::GetJobMetricsRequest& request,
                          std::function<void(absl::StatusOr<v1::GetJobMetricsReply>)> done);
  // GetJobSamples, likewise.
  void GetJobSamplesAsync(EventLoop& loop, const v1::GetJobSamplesRequest& request,
                          std::function<void(absl::StatusOr<v1::GetJobSamplesReply>)> done);

  // ClusterService.
  absl::StatusOr<v1::ListWorkersReply> ListWorkers(const v1::ListWorkersRequest& request);
  absl::StatusOr<v1::GetClusterReply> GetCluster(const v1::GetClusterRequest& request);
  absl::StatusOr<v1::DrainWorkerReply> DrainWorker(const v1::DrainWorkerRequest& request);
  absl::StatusOr<v1::UndrainWorkerReply> UndrainWorker(const v1::UndrainWorkerRequest& request);

  // WorkerRegistry.
  absl::StatusOr<v1::RegisterWorkerReply> RegisterWorker(const v1::RegisterWorkerRequest& request);
  absl::StatusOr<v1::HeartbeatReply> Heartbeat(const v1::HeartbeatRequest& request);

  // Marks silent workers lost; run periodically by the event loop.
  void SweepLiveness();

  // Starts running jobs (without it they stay queued, as in tests of the API alone): jobs the
  // previous controller ran recover, waiting ones are placed. `post` runs a task on the event
  // loop the controller lives on.
  void StartRunner(JobRunner::Poster post, RunnerOptions options);
  // Periodic work of the loop: liveness, then placement.
  void Tick();
  // Stops the drivers (shutdown); jobs keep their states for the next controller.
  void StopRunner();

  const ControllerOptions& options() const { return options_; }

 private:
  Controller(ControllerOptions options, Clock clock, JobStore store, DrainStore drains,
             std::unique_ptr<MetricHistory> history);
  void Schedule();

  ControllerOptions options_;
  Clock clock_;
  int64_t start_time_ms_;
  DrainStore drains_;
  WorkerRegistry workers_;
  JobManager jobs_;
  std::unique_ptr<MetricHistory> history_;
  EventLoop history_reads_;            // reads of history_ off the loop (GetJob*Async)
  std::unique_ptr<JobRunner> runner_;  // last: its drivers report into the members above
};

}  // namespace rlhfd::controller
