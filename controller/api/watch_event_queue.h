// WatchEventQueue: the events of one WatchJob stream waiting for the client to read them. A
// client that stops reading while its connection stays up must not grow the controller's memory
// by one event a step for as long as the job runs, so the queue holds at most kMaxStepEvents step
// events: a newer one pushes out the oldest (the job's whole history stays in GetJobMetrics).
// State events are all kept — a job changes state a bounded number of times, and a watcher must
// see every change, its end above all.
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

  void Push(const v1::JobEvent& event);
  // The oldest waiting event, removed; nullopt when none waits.
  std::optional<v1::JobEvent> Pop();
  bool empty() const { return waiting_.empty(); }
  size_t size() const { return waiting_.size(); }
  // Step events pushed out so far.
  int64_t dropped() const { return dropped_; }

 private:
  std::deque<v1::JobEvent> waiting_;
  size_t step_events_ = 0;
  int64_t dropped_ = 0;
};

}  // namespace rlhfd::controller
