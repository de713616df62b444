// JobDriver: runs one placed job on its own thread through the stages of its workers (JobStages
// over gRPC stage clients): start and load the latest checkpoint, then step by step — the next
// prompts, the RL step, validation and checkpoints on their cadence — to the last step. It owns
// no controller state: what happens is reported through DriverEvents, which the job runner posts
// onto the controller's event loop. The thread never touches the loop's objects.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/grpc_options.h"
#include "controller/driver/pool_calls.h"
#include "controller/driver/prompt_data.h"
#include "controller/driver/rl_step.h"
#include "rlhfd/v1/job_service.pb.h"
#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::controller {

class JobStages;
class KlController;

// A checkpoint as the job's progress records it: the step, its rows, the KL coefficient and the
// actor's optimiser steps it was saved with.
struct CheckpointMark {
  int64_t step = 0;
  StepRows rows;
  double kl_coef = 0;
  int64_t optimizer_steps = 0;
};

struct DriverSetup {
  std::string job_id;
  int64_t job_submit_time_ms = 0;  // with job_id, the job's identity in its checkpoints
  v1::JobSpec spec;
  std::vector<std::string> addresses;   // worker address by world rank
  std::vector<std::string> worker_ids;  // worker id by world rank (errors name them)
  bool nccl = false;
  std::string token;
  RpcOptions rpc;
  // Where the job stands: a recovering job loads progress.checkpoint_step and goes on from it.
  v1::JobProgress progress;
  absl::Duration stage_deadline = absl::Minutes(30);
  int stage_relay_above = 64;  // JobStagesOptions::relay_above
  int64_t communicator_timeout_ms = 300000;
  // How long a checkpoint save that finds the disk full (ENOSPC, EDQUOT) is tried again, with
  // backoff, before the job fails; its previous checkpoint stays committed either way.
  absl::Duration disk_full_timeout = absl::Minutes(10);
};

// Called on the driver's thread, in order; they must not block.
struct DriverEvents {
  // The job's workers have started its roles and loaded the checkpoint `progress` names (0:
  // none): it runs.
  std::function<void(const v1::JobProgress& progress)> running;
  // Something the job's owner should see that changes no state: a damaged checkpoint passed
  // over (naming the file), a save waiting for disk space. Logged, and told to watchers.
  std::function<void(const std::string& notice)> notice;
  // A step (or validation, as step metrics) is done; `progress` is the job's progress after it.
  std::function<void(const v1::StepMetrics& step, const v1::JobProgress& progress)> step;
  // The driver has ended: OK after the last step; otherwise the error, and whether it is a
  // fault a restart may cure (a lost worker, a failed collective, a deadline) rather than the
  // job's own (a bad model directory, bad data). `unanswered`: the workers that had not answered
  // a stage past its deadline (a hung or slow host among them), when that ended the run.
  std::function<void(absl::Status status, bool fault, std::vector<std::string> unanswered)>
      finished;
};

class JobDriver {
 public:
  // Starts the thread.
  JobDriver(DriverSetup setup, DriverEvents events);
  // Cancels, and joins the thread (which then only ends the workers' roles).
  ~JobDriver();
  JobDriver(const JobDriver&) = delete;
  JobDriver& operator=(const JobDriver&) = delete;

  // Stops the job as soon as possible: stage calls in flight are cancelled, the workers' roles
  // ended; `finished` still comes, with CANCELLED (or `cause` as a fault, when given).
  void Cancel(absl::Status cause = absl::CancelledError("cancelled"));

  // True for the failures a restart may cure.
  static bool IsFault(const absl::Status& status);

 private:
  struct RunData;

  void Run();
  absl::Status Drive();
  // The cause when the run is cancelled; OK otherwise.
  absl::Status CheckCancelled();
  // The run's prompts (overlong ones left out when data.filter_overlong_prompts says so) and
  // its last step; refuses data that would not fit a stage call.
  absl::StatusOr<RunData> LoadData(JobStages& job);
  // Loads the checkpoint the run goes on from, if any, into `progress` and `kl_coef`; the first
  // step to run.
  absl::StatusOr<int64_t> Resume(JobStages& job, const RunData& run, v1::JobProgress& progress,
                                 double& kl_coef);
  // Validation after `step` (0: before training), its metrics (per data source too) into `into`,
  // its logged responses appended to `samples`.
  absl::Status ValidateInto(JobStages& job, const RunData& run, int64_t step, Metrics& into,
                            std::vector<v1::ResponseSample>& samples);
  // Step `step`'s plan: its prompts and seed (the KL coefficient is the caller's).
  StepPlan PlanOf(const RunData& run, int64_t step) const;
  // Step `step` with its dump, validation and checkpoint on their cadence; its metrics to
  // events_.step.
  absl::Status RunOneStep(JobStages& job, const RunData& run, int64_t step, KlController& kl,
                          v1::JobProgress& progress);
  // SaveCheckpoint, tried again with backoff while the disk is full, up to
  // setup_.disk_full_timeout; `committed` is the job's checkpoint before this one (0: none).
  absl::Status SaveWaitingForSpace(JobStages& job, int64_t step, bool export_huggingface,
                                   double kl_coef, int64_t committed);

  // Step `step`'s checkpoint (of `total`) on trainer.save_every's cadence. With
  // trainer.async_save, first the finish of the background save an earlier step started, whose
  // commit rides on this step's save (rank 0's thread makes it) or is made here when this step
  // saves none; `progress` records each checkpoint once its commit is confirmed. Whether any
  // checkpoint work was done.
  absl::StatusOr<bool> SaveAtStep(JobStages& job, int64_t total, int64_t step, const StepRows& rows,
                                  double kl_coef, v1::JobProgress& progress);

  DriverSetup setup_;
  DriverEvents events_;
  // trainer.async_save: the step whose background save is in flight, and the step its rank 0
  // commits first; each goes into the job's progress once confirmed.
  std::optional<CheckpointMark> background_save_;
  std::vector<std::string> unanswered_;  // set by Drive as it ends
  std::optional<CheckpointMark> committing_;
  std::atomic<bool> cancelled_{false};
  std::condition_variable cancel_wake_;  // with cause_mutex_: wakes a save waiting for space
  std::mutex cause_mutex_;
  absl::Status cause_;
  std::function<void()> cancel_calls_;  // set by Drive while its clients exist
  std::mutex cancel_mutex_;
  std::thread thread_;
};

}  // namespace rlhfd::controller
