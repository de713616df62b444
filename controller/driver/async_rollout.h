// trainer.mode async: the rollout pool (roles.rollout) generates the next steps' batches on a
// thread of its own while the actor trains, each batch started with weights at most
// trainer.max_staleness updates behind the ones it will be trained from.
//
// The trainer's side is Take(step), before the step trains: it sends the pool the weights after
// the previous update (at once: with roles.rollout.partial_rollout the generation running stops
// for it and goes on with them, resuming its unfinished responses; without, the update waits for
// the batch being generated), waits for the step's batch and moves its rows to the actor ranks.
// Those two calls need the pool's ranks between generations, so the thread starts nothing while
// they run, and no batch past the one the trainer waits for.
//
// Only the rollout pool's ranks take this thread's calls; the calls of both (the weights, the
// rows) are the trainer's. Blocking: Take from the driver's thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "absl/status/statusor.h"
#include "controller/driver/pool_calls.h"
#include "controller/driver/rl_step.h"
#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::controller {

class AsyncRollout {
 public:
  // Generates the batches of steps `first`..`last`, each the plan `plan_of` gives (any thread);
  // the pool gets its first weights from the first Take. `pools` and `spec` outlive this.
  AsyncRollout(const PoolCalls& pools, const v1::JobSpec& spec,
               std::function<StepPlan(int64_t step)> plan_of, int64_t first, int64_t last);
  // Stops the thread: the rollout pool's calls in flight are cancelled.
  ~AsyncRollout();
  AsyncRollout(const AsyncRollout&) = delete;
  AsyncRollout& operator=(const AsyncRollout&) = delete;

  // Step `step`'s batch on the actor ranks (adopted), generated from the weights after the
  // update of step weights_step (and, with partial rollouts, later ones), after sending the pool
  // the weights after step - 1's update. Steps are taken in order. A failure of the batch's
  // generation carries WithFailedRollout's step; after any failure the object is spent.
  absl::StatusOr<StepRollout> Take(int64_t step);

 private:
  void Generate();
  // Runs `call` (of the pool's ranks and the actor's) while the thread starts nothing.
  absl::Status PoolCall(const std::function<absl::Status()>& call);

  const PoolCalls& pools_;
  const v1::JobSpec& spec_;
  const std::function<StepPlan(int64_t)> plan_of_;
  const int64_t first_, last_;
  const int64_t max_staleness_;

  std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  int64_t pool_weights_step_ = -1;  // the step whose update the pool's weights include (-1: none)
  int64_t waited_for_ = 0;          // the batch the trainer waits for (0: none)
  bool pool_call_running_ = false;
  std::map<int64_t, StepRollout> made_;  // generated, not yet taken
  absl::Status failed_;                  // the thread's failure, once it stopped on one
  bool ended_ = false;                   // the thread has nothing more to do
  std::thread thread_;                   // last: started once the rest is set
};

}  // namespace rlhfd::controller
