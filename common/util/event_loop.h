// EventLoop: one thread that runs posted tasks and timers in order. The controller's state is
// owned by its loop, so state changes need no locks and RPC threads never block on them.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/time/time.h"

namespace rlhfd {

class EventLoop {
 public:
  using Task = std::function<void()>;

  EventLoop();
  // Stops the loop; tasks not yet run are dropped (their captured state is destroyed).
  ~EventLoop();
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Runs `task` on the loop thread after all tasks posted before it. Safe from any thread. A task
  // that throws is logged and the loop goes on.
  void Post(Task task);
  // Runs `task` on the loop thread once `delay` has passed.
  void PostAfter(absl::Duration delay, Task task);
  // Runs `task` on the loop thread every `period` until the loop stops.
  void PostEvery(absl::Duration period, Task task);
  // Finishes the task in hand and joins the thread; later posts are ignored. Idempotent.
  void Stop();
  // As Stop, but waits at most `timeout` for the task in hand. False when it is still running:
  // the thread is then left behind, and the caller must end the process rather than destroy
  // what the task uses.
  bool StopWithin(absl::Duration timeout);

  bool InLoopThread() const { return std::this_thread::get_id() == thread_id_; }

 private:
  void Run();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable exited_cv_;
  // Due time → task; the sequence number keeps equal due times in posting order.
  std::map<std::pair<absl::Time, uint64_t>, Task> tasks_;
  uint64_t next_sequence_ = 0;
  bool stopping_ = false;
  bool exited_ = false;
  std::thread thread_;
  std::thread::id thread_id_;
};

}  // namespace rlhfd
