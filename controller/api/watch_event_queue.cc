// See watch_event_queue.h.
#include "controller/api/watch_event_queue.h"

#include <algorithm>

namespace rlhfd::controller {
namespace {

// JobManager::PublishStep's events carry their step's metrics (step 0: the validation before
// training); state events carry neither.
bool IsStepEvent(const v1::JobEvent& event) { return event.step() > 0 || !event.metrics().empty(); }

}  // namespace

void WatchEventQueue::Push(const v1::JobEvent& event) {
  waiting_.push_back(event);
  if (!IsStepEvent(event)) return;
  if (++step_events_ <= kMaxStepEvents) return;
  waiting_.erase(std::find_if(waiting_.begin(), waiting_.end(), IsStepEvent));
  --step_events_;
  ++dropped_;
}

std::optional<v1::JobEvent> WatchEventQueue::Pop() {
  if (waiting_.empty()) return std::nullopt;
  v1::JobEvent event = std::move(waiting_.front());
  waiting_.pop_front();
  if (IsStepEvent(event)) --step_events_;
  return event;
}

}  // namespace rlhfd::controller
