// Implementation of EventLoop on one std::thread and a time-ordered task map.
#include "common/util/event_loop.h"

#include <exception>
#include <memory>

#include "absl/time/clock.h"
#include "common/logging/logging.h"

namespace rlhfd {

EventLoop::EventLoop() : thread_([this] { Run(); }) { thread_id_ = thread_.get_id(); }

EventLoop::~EventLoop() { Stop(); }

void EventLoop::Post(Task task) { PostAfter(absl::ZeroDuration(), std::move(task)); }

void EventLoop::PostAfter(absl::Duration delay, Task task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    tasks_.emplace(std::make_pair(absl::Now() + delay, next_sequence_++), std::move(task));
  }
  wake_.notify_one();
}

void EventLoop::PostEvery(absl::Duration period, Task task) {
  // The repeating task re-posts itself after each run; it shares `task` between repetitions.
  auto shared = std::make_shared<Task>(std::move(task));
  auto repeat = std::make_shared<Task>();
  std::weak_ptr<Task> weak_repeat = repeat;
  *repeat = [this, period, shared, weak_repeat] {
    // Re-posted first, so a repetition that throws does not end the repeating.
    if (auto self = weak_repeat.lock()) PostAfter(period, [self] { (*self)(); });
    (*shared)();
  };
  PostAfter(period, [repeat] { (*repeat)(); });
}

void EventLoop::Stop() { StopWithin(absl::InfiniteDuration()); }

bool EventLoop::StopWithin(absl::Duration timeout) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    stopping_ = true;
    wake_.notify_one();
    if (!thread_.joinable() || InLoopThread()) return true;
    const auto exited = [this] { return exited_; };
    if (timeout == absl::InfiniteDuration()) {
      exited_cv_.wait(lock, exited);  // wait_for(max) would overflow the clock.
    } else if (!exited_cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), exited)) {
      thread_.detach();
      return false;
    }
  }
  thread_.join();
  return true;
}

void EventLoop::Run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    if (tasks_.empty()) {
      wake_.wait(lock);
      continue;
    }
    auto first = tasks_.begin();
    const absl::Time due = first->first.first;
    const absl::Time now = absl::Now();
    if (due > now) {
      wake_.wait_for(lock, absl::ToChronoNanoseconds(due - now));
      continue;
    }
    Task task = std::move(first->second);
    tasks_.erase(first);
    lock.unlock();
    // No exception may end the loop (and with it the daemon): a task's failure is its own.
    try {
      task();
    } catch (const std::exception& error) {
      RLOG(ERROR) << "event loop task threw: " << error.what();
    } catch (...) {
      RLOG(ERROR) << "event loop task threw a non-standard exception";
    }
    task = nullptr;  // Destroy captures outside the lock.
    lock.lock();
  }
  tasks_.clear();
  exited_ = true;
  exited_cv_.notify_all();
}

}  // namespace rlhfd
