// Implementation of EventLoop on one std::thread and a time-ordered task map.
#include "common/util/event_loop.h"

#include <memory>

#include "absl/time/clock.h"

namespace rlhfd {

EventLoop::EventLoop() : thread_([this] { Run(); }) {}

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
    (*shared)();
    if (auto self = weak_repeat.lock()) PostAfter(period, [self] { (*self)(); });
  };
  PostAfter(period, [repeat] { (*repeat)(); });
}

void EventLoop::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable() && !InLoopThread()) thread_.join();
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
    task();
    task = nullptr;  // Destroy captures outside the lock.
    lock.lock();
  }
  tasks_.clear();
}

}  // namespace rlhfd
