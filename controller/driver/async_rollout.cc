#include "controller/driver/async_rollout.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/util/stopwatch.h"

namespace rlhfd::controller {

AsyncRollout::AsyncRollout(const PoolCalls& pools, const v1::JobSpec& spec,
                           std::function<StepPlan(int64_t step)> plan_of, int64_t first,
                           int64_t last)
    : pools_(pools),
      spec_(spec),
      plan_of_(std::move(plan_of)),
      first_(first),
      last_(last),
      max_staleness_(std::max(1, spec.trainer().max_staleness())),
      thread_([this] { Generate(); }) {}

AsyncRollout::~AsyncRollout() {
  std::unique_lock<std::mutex> lock(mutex_);
  stopping_ = true;
  changed_.notify_all();
  // A call may start between two cancellations: cancel until the thread has seen stopping_.
  while (!ended_) {
    lock.unlock();
    pools_.CancelCalls(pools_.RanksOf(v1::ROLE_ROLLOUT));
    lock.lock();
    changed_.wait_for(lock, std::chrono::milliseconds(50), [this] { return ended_; });
  }
  lock.unlock();
  thread_.join();
}

void AsyncRollout::Generate() {
  const auto batches = [this]() -> absl::Status {
    for (int64_t step = first_; step <= last_; ++step) {
      int64_t weights_step = 0;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        // A batch starts on weights at most max_staleness updates behind those it is trained
        // from (step - 1's), with no call of the trainer's on the pool, and not past the batch
        // the trainer waits for (whose rows must leave the pool before another batch starts).
        changed_.wait(lock, [&] {
          return stopping_ ||
                 (pool_weights_step_ >= 0 && pool_weights_step_ >= step - 1 - max_staleness_ &&
                  !pool_call_running_ && (waited_for_ == 0 || step <= waited_for_));
        });
        if (stopping_) return absl::CancelledError("the asynchronous rollout was stopped");
        weights_step = pool_weights_step_;
      }
      const auto after_pool_calls = [this] {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [this] { return stopping_ || !pool_call_running_; });
      };
      absl::StatusOr<StepRollout> made =
          GenerateRollout(pools_, spec_, plan_of_(step), weights_step, after_pool_calls);
      if (!made.ok()) return WithFailedRollout(made.status(), step);
      std::lock_guard<std::mutex> lock(mutex_);
      made_[step] = *std::move(made);
      changed_.notify_all();
    }
    return absl::OkStatus();
  };
  // Nothing thrown leaves the thread: it ends the rollout as a failure the next Take returns.
  absl::Status status;
  try {
    status = batches();
  } catch (const std::exception& error) {
    status = absl::InternalError(absl::StrCat("the asynchronous rollout failed: ", error.what()));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  failed_ = status;
  ended_ = true;
  changed_.notify_all();
}

absl::Status AsyncRollout::PoolCall(const std::function<absl::Status()>& call) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pool_call_running_ = true;
  }
  const absl::Status status = call();
  std::lock_guard<std::mutex> lock(mutex_);
  pool_call_running_ = false;
  changed_.notify_all();
  return status;
}

absl::StatusOr<StepRollout> AsyncRollout::Take(int64_t step) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    waited_for_ = step;
  }
  // The weights after the last update, at once: a partial rollout running stops for them.
  RolloutWeights weights;
  RETURN_IF_ERROR(PoolCall([&]() -> absl::Status {
    ASSIGN_OR_RETURN(weights, SyncRolloutWeights(pools_, step, step - 1));
    std::lock_guard<std::mutex> lock(mutex_);
    pool_weights_step_ = step - 1;
    return absl::OkStatus();
  }));
  const Stopwatch waited;
  StepRollout rollout;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return made_.count(step) > 0 || ended_; });
    const auto found = made_.find(step);
    if (found == made_.end()) {
      if (!failed_.ok()) return failed_;
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", step, ": the asynchronous rollout generates steps ", first_, "..", last_));
    }
    rollout = std::move(found->second);
    made_.erase(found);
  }
  rollout.metrics["timing_s/wait_rollout"] = waited.Seconds();
  AddRolloutWeights(weights, rollout);
  RETURN_IF_ERROR(
      PoolCall([&] { return AdoptPoolRollout(pools_, spec_, plan_of_(step), rollout); }));
  std::lock_guard<std::mutex> lock(mutex_);
  waited_for_ = 0;
  changed_.notify_all();
  return rollout;
}

}  // namespace rlhfd::controller
