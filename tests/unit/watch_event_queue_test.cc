// WatchEventQueue: what a WatchJob stream keeps for a client that reads slower than the job
// steps — every change of state, the newest kMaxStepEvents step events and the newest
// kMaxNotices notices, in order.
#include "controller/api/watch_event_queue.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace rlhfd::controller {
namespace {

v1::JobEvent StateEvent(v1::JobState state) {
  v1::JobEvent event;
  event.set_job_id("job-1");
  event.set_state(state);
  return event;
}

v1::JobEvent Notice(v1::JobState state, const std::string& message) {
  v1::JobEvent event = StateEvent(state);
  event.set_message(message);
  return event;
}

v1::JobEvent StepEvent(int64_t step) {
  v1::JobEvent event = StateEvent(v1::JOB_STATE_RUNNING);
  event.set_step(step);
  (*event.mutable_metrics())["critic/score/mean"] = 0.5;
  return event;
}

// Pops everything: (step, state) of each event in order.
std::vector<std::pair<int64_t, v1::JobState>> Drain(WatchEventQueue& queue) {
  std::vector<std::pair<int64_t, v1::JobState>> events;
  while (std::optional<v1::JobEvent> event = queue.Pop()) {
    events.emplace_back(event->step(), event->state());
  }
  return events;
}

TEST_CASE("a watch stream's queue keeps every event while the client keeps up", "[watch]") {
  WatchEventQueue queue;
  CHECK_FALSE(queue.Pop().has_value());
  queue.Push(StateEvent(v1::JOB_STATE_RUNNING));
  // Step 0 (the validation before training) is a step event like the others.
  for (int64_t step = 0; step < static_cast<int64_t>(WatchEventQueue::kMaxStepEvents); ++step) {
    queue.Push(StepEvent(step));
  }
  queue.Push(StateEvent(v1::JOB_STATE_SUCCEEDED));
  CHECK(queue.dropped() == 0);
  const auto events = Drain(queue);
  REQUIRE(events.size() == WatchEventQueue::kMaxStepEvents + 2);
  CHECK(events.front().second == v1::JOB_STATE_RUNNING);
  for (size_t i = 1; i + 1 < events.size(); ++i) CHECK(events[i].first == int64_t(i) - 1);
  CHECK(events.back().second == v1::JOB_STATE_SUCCEEDED);
  CHECK(queue.empty());
}

TEST_CASE("a stalled watcher's queue stays bounded: the newest steps and every state change",
          "[watch]") {
  WatchEventQueue queue;
  constexpr int64_t kSteps = 10'000;
  queue.Push(StateEvent(v1::JOB_STATE_RUNNING));
  for (int64_t step = 1; step <= kSteps; ++step) {
    queue.Push(StepEvent(step));
    if (step == 5'000) queue.Push(StateEvent(v1::JOB_STATE_RECOVERING));
    if (step == 5'001) queue.Push(StateEvent(v1::JOB_STATE_RUNNING));
    CHECK(queue.size() <= WatchEventQueue::kMaxStepEvents + 3);
  }
  queue.Push(StateEvent(v1::JOB_STATE_SUCCEEDED));
  CHECK(queue.dropped() == kSteps - static_cast<int64_t>(WatchEventQueue::kMaxStepEvents));

  const auto events = Drain(queue);
  std::vector<v1::JobState> states;
  std::vector<int64_t> steps;
  for (const auto& [step, state] : events) {
    if (step == 0) {
      states.push_back(state);
    } else {
      steps.push_back(step);
    }
  }
  CHECK(states == std::vector<v1::JobState>{v1::JOB_STATE_RUNNING, v1::JOB_STATE_RECOVERING,
                                            v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED});
  REQUIRE(steps.size() == WatchEventQueue::kMaxStepEvents);
  for (size_t i = 0; i < steps.size(); ++i) {
    CHECK(steps[i] == kSteps - int64_t(WatchEventQueue::kMaxStepEvents) + 1 + int64_t(i));
  }
  // The end comes last, after the steps it followed.
  CHECK(events.back().second == v1::JOB_STATE_SUCCEEDED);
}

TEST_CASE("a stalled watcher's notices stay bounded; the changes of state around them stay",
          "[watch]") {
  // A disk-full wait repeats its notice (the state unchanged, a new message) every few seconds
  // for as long as the disk stays full.
  WatchEventQueue queue;
  queue.Push(StateEvent(v1::JOB_STATE_RUNNING));
  for (int i = 0; i < 1'000; ++i) {
    queue.Push(Notice(v1::JOB_STATE_RUNNING, absl::StrCat("disk full; retrying (", i, ")")));
    if (i % 100 == 0) queue.Push(StepEvent(i / 100 + 1));
  }
  queue.Push(StateEvent(v1::JOB_STATE_FAILED));
  CHECK(queue.size() == 1 + WatchEventQueue::kMaxNotices + 10 + 1);
  std::vector<std::string> notices;
  std::vector<v1::JobState> changes;
  int steps = 0;
  while (std::optional<v1::JobEvent> event = queue.Pop()) {
    if (event->step() > 0) {
      ++steps;
    } else if (event->message().empty()) {
      changes.push_back(event->state());
    } else {
      notices.push_back(event->message());
    }
  }
  CHECK(steps == 10);
  CHECK(changes == std::vector<v1::JobState>{v1::JOB_STATE_RUNNING, v1::JOB_STATE_FAILED});
  REQUIRE(notices.size() == WatchEventQueue::kMaxNotices);
  CHECK(notices.back() == "disk full; retrying (999)");
  CHECK(notices.front() ==
        absl::StrCat("disk full; retrying (", 1'000 - WatchEventQueue::kMaxNotices, ")"));
}

TEST_CASE("a watch queue drained part-way keeps counting only the step events it holds",
          "[watch]") {
  WatchEventQueue queue;
  for (int64_t step = 1; step <= 100; ++step) {
    queue.Push(StepEvent(step));
    if (step % 10 == 5) (void)queue.Pop();  // A slow reader: one event in ten.
  }
  CHECK(queue.size() == WatchEventQueue::kMaxStepEvents);
  const auto events = Drain(queue);
  CHECK(events.back().first == 100);
  for (size_t i = 1; i < events.size(); ++i) CHECK(events[i].first > events[i - 1].first);
}

}  // namespace
}  // namespace rlhfd::controller
