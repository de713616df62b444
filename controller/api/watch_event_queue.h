// WatchEventQueue: the events of one WatchJob stream waiting for the client to read them. A
// client that stops reading while its connection stays up must not grow the controller's memory
// by one event a step (or a notice every few seconds, such as a disk-full wait's) for as long as
// the job runs, so the queue holds at most kMaxStepEvents step events and kMaxNotices notices
// (state events that repeat the state before them, with a new message): a newer one pushes out
// the oldest of its kind (the job's whole history stays in GetJobMetrics). Changes of state are
// all kept: a job changes state a bounded number of times (its restarts are bounded), and a
// watcher must see every change, its end above all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>

#include "rlhfd/v1/job_service.pb.h"

namespace rlhfd::controller {

class WatchEventQueue {
 public:
  static constexpr size_t kMaxStepEvents = 64;
  static constexpr size_t kMaxNotices = 16;

  void Push(const v1::JobEvent& event);
  // The oldest waiting event, removed; nullopt when none waits.
  std::optional<v1::JobEvent> Pop();
  bool empty() const { return waiting_.empty(); }
  size_t size() const { return waiting_.size(); }
  // Step events and notices pushed out so far.
  int64_t dropped() const { return dropped_; }

 private:
  enum class Kind { kStep, kNotice, kChange };
  struct Waiting {
    v1::JobEvent event;
    Kind kind;
  };

  size_t& CountOf(Kind kind) { return kind == Kind::kStep ? steps_ : notices_; }

  std::deque<Waiting> waiting_;
  size_t steps_ = 0, notices_ = 0;
  std::optional<v1::JobState> last_state_;  // Of the last state event pushed.
  int64_t dropped_ = 0;
};

}  // namespace rlhfd::controller
