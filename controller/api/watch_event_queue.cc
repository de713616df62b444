// See watch_event_queue.h.
#include "controller/api/watch_event_queue.h"

#include <algorithm>

namespace rlhfd::controller {

void WatchEventQueue::Push(const v1::JobEvent& event) {
  // JobManager::PublishStep's events carry their step's metrics (step 0: the validation before
  // training); state events carry neither.
  Kind kind = Kind::kChange;
  if (event.step() > 0 || !event.metrics().empty()) {
    kind = Kind::kStep;
  } else {
    if (last_state_ == event.state()) kind = Kind::kNotice;
    last_state_ = event.state();
  }
  waiting_.push_back({event, kind});
  if (kind == Kind::kChange) return;
  const size_t limit = kind == Kind::kStep ? kMaxStepEvents : kMaxNotices;
  if (++CountOf(kind) <= limit) return;
  waiting_.erase(std::find_if(waiting_.begin(), waiting_.end(),
                              [kind](const Waiting& waiting) { return waiting.kind == kind; }));
  --CountOf(kind);
  ++dropped_;
}

std::optional<v1::JobEvent> WatchEventQueue::Pop() {
  if (waiting_.empty()) return std::nullopt;
  Waiting oldest = std::move(waiting_.front());
  waiting_.pop_front();
  if (oldest.kind != Kind::kChange) --CountOf(oldest.kind);
  return std::move(oldest.event);
}

}  // namespace rlhfd::controller
