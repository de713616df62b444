// EventLoop: order of posted tasks, timers, repetition and stopping.
#include <catch2/catch.hpp>

#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "absl/time/clock.h"
#include "common/util/event_loop.h"

namespace rlhfd {

TEST_CASE("posted tasks run in order on one thread", "[event_loop]") {
  EventLoop loop;
  std::vector<int> order;
  std::promise<void> done;
  for (int i = 0; i < 100; ++i) {
    loop.Post([&order, i, &loop] {
      REQUIRE(loop.InLoopThread());
      order.push_back(i);
    });
  }
  loop.Post([&] { done.set_value(); });
  REQUIRE(done.get_future().wait_for(std::chrono::seconds(5)) == std::future_status::ready);
  REQUIRE(order.size() == 100);
  for (int i = 0; i < 100; ++i) CHECK(order[i] == i);
}

TEST_CASE("delayed tasks run after their delay, in due order", "[event_loop]") {
  EventLoop loop;
  std::mutex mutex;
  std::vector<int> order;
  std::promise<void> done;
  const absl::Time start = absl::Now();
  loop.PostAfter(absl::Milliseconds(120), [&] {
    std::lock_guard<std::mutex> lock(mutex);
    order.push_back(2);
    done.set_value();
  });
  loop.PostAfter(absl::Milliseconds(40), [&] {
    std::lock_guard<std::mutex> lock(mutex);
    order.push_back(1);
  });
  REQUIRE(done.get_future().wait_for(std::chrono::seconds(5)) == std::future_status::ready);
  CHECK(absl::Now() - start >= absl::Milliseconds(120));
  std::lock_guard<std::mutex> lock(mutex);
  CHECK(order == std::vector<int>{1, 2});
}

TEST_CASE("repeating tasks repeat until the loop stops", "[event_loop]") {
  std::atomic<int> runs{0};
  {
    EventLoop loop;
    loop.PostEvery(absl::Milliseconds(10), [&] { ++runs; });
    absl::SleepFor(absl::Milliseconds(200));
    loop.Stop();
    const int at_stop = runs.load();
    CHECK(at_stop >= 5);
    absl::SleepFor(absl::Milliseconds(50));
    CHECK(runs.load() == at_stop);
    loop.Post([&] { runs += 1000; });  // Ignored after Stop.
  }
  CHECK(runs.load() < 1000);
}

TEST_CASE("a task that throws is logged and the loop goes on", "[event_loop]") {
  EventLoop loop;
  std::promise<void> done;
  loop.Post([] { throw std::runtime_error("a task's own failure"); });
  loop.Post([] { throw 42; });
  loop.Post([&] { done.set_value(); });
  REQUIRE(done.get_future().wait_for(std::chrono::seconds(5)) == std::future_status::ready);
}

TEST_CASE("StopWithin gives up on a task that does not finish", "[event_loop]") {
  std::atomic<bool> release{false};
  auto loop = std::make_unique<EventLoop>();
  std::promise<void> started;
  loop->Post([&] {
    started.set_value();
    while (!release) absl::SleepFor(absl::Milliseconds(5));
  });
  started.get_future().wait();
  const absl::Time start = absl::Now();
  CHECK_FALSE(loop->StopWithin(absl::Milliseconds(100)));
  CHECK(absl::Now() - start < absl::Seconds(1));
  // The task can still end; the loop thread then exits on its own.
  release = true;
  absl::SleepFor(absl::Milliseconds(50));
  loop.reset();
  // A loop that is idle stops at once.
  EventLoop idle;
  CHECK(idle.StopWithin(absl::Milliseconds(100)));
}

}  // namespace rlhfd
