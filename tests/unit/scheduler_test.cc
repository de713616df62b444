// PlaceJob: which workers a job gets, and the collectives' transport it implies;
// PlaceJobAfterFault: where a job goes again after workers left its run unanswered.
#include "controller/scheduler/scheduler.h"

#include <catch2/catch.hpp>
#include <set>
#include <utility>

#include "absl/strings/match.h"

namespace rlhfd::controller {
namespace {

v1::Worker GpuWorker(const std::string& id, const std::string& host, int device_index) {
  v1::Worker worker;
  worker.set_worker_id(id);
  worker.set_address(host + ":7000");
  worker.set_state(v1::WORKER_STATE_ALIVE);
  worker.set_last_heartbeat_time_ms(100);
  worker.mutable_capacity()->set_host(host);
  worker.mutable_capacity()->set_device_kind(v1::DEVICE_KIND_CUDA);
  worker.mutable_capacity()->set_device_index(device_index);
  return worker;
}

}  // namespace

TEST_CASE("GPU workers on devices of their own talk over NCCL; sharing a GPU, over sockets",
          "[scheduler]") {
  const PlacementNeed need{.device = "cuda", .world_size = 2};
  SECTION("two GPUs of one host, and one GPU of each of two hosts") {
    for (const auto& workers : {std::vector{GpuWorker("a", "h1", 0), GpuWorker("b", "h1", 1)},
                                std::vector{GpuWorker("a", "h1", 0), GpuWorker("b", "h2", 0)}}) {
      const absl::StatusOr<Placement> placement = PlaceJob(need, workers, {});
      REQUIRE(placement.ok());
      CHECK(placement->gpu);
      CHECK(placement->nccl);
      CHECK(placement->shared_gpu.empty());
    }
  }
  SECTION("GPUs of their own first; two workers on one GPU only when no other is free") {
    const std::vector workers = {GpuWorker("a", "h1", 0), GpuWorker("b", "h1", 0),
                                 GpuWorker("c", "h1", 1)};
    const absl::StatusOr<Placement> apart = PlaceJob(need, workers, {});
    REQUIRE(apart.ok());
    CHECK(apart->worker_ids == std::vector<std::string>{"a", "c"});
    CHECK(apart->nccl);
    CHECK(apart->shared_gpu.empty());
    // c is busy: a and b share GPU 0, which NCCL refuses.
    const absl::StatusOr<Placement> shared = PlaceJob(need, workers, {{"c", "job-1"}});
    REQUIRE(shared.ok());
    CHECK(shared->worker_ids == std::vector<std::string>{"a", "b"});
    CHECK(shared->gpu);
    CHECK_FALSE(shared->nccl);
    CHECK(shared->shared_gpu == "a and b share GPU 0 of h1");
  }
  SECTION("CPU jobs never use NCCL, and CPU workers of one host share no GPU") {
    std::vector<v1::Worker> workers;
    for (const std::string id : {"a", "b"}) {
      v1::Worker worker = GpuWorker(id, "h1", -1);
      worker.mutable_capacity()->set_device_kind(v1::DEVICE_KIND_CPU);
      workers.push_back(worker);
    }
    const absl::StatusOr<Placement> placement =
        PlaceJob({.device = "cpu", .world_size = 2}, workers, {});
    REQUIRE(placement.ok());
    CHECK_FALSE(placement->gpu);
    CHECK_FALSE(placement->nccl);
    CHECK(placement->shared_gpu.empty());
  }
}

TEST_CASE("after a fault, a job goes apart from the workers that left it unanswered",
          "[scheduler]") {
  const PlacementNeed need{.device = "cpu", .world_size = 2};
  // Four CPU workers; a and b left the last run unanswered at t = 1,000 ms.
  auto workers_heard_at = [](int64_t a, int64_t b, int64_t c, int64_t d) {
    std::vector<v1::Worker> workers;
    for (const auto& [id, heard] :
         std::vector<std::pair<std::string, int64_t>>{{"a", a}, {"b", b}, {"c", c}, {"d", d}}) {
      v1::Worker worker = GpuWorker(id, "h1", -1);
      worker.mutable_capacity()->set_device_kind(v1::DEVICE_KIND_CPU);
      worker.set_last_heartbeat_time_ms(heard);
      workers.push_back(worker);
    }
    return workers;
  };
  const std::set<std::string> avoided = {"a", "b"};
  SECTION("others heard since the fault: placed on them") {
    const absl::StatusOr<Placement> placement =
        PlaceJobAfterFault(need, workers_heard_at(1200, 1200, 1200, 1200), {}, avoided, 1000);
    REQUIRE(placement.ok());
    CHECK(placement->worker_ids == std::vector<std::string>{"c", "d"});
  }
  SECTION("others alive but not heard since (a lagging heartbeat): wait, not the avoided ones") {
    const absl::StatusOr<Placement> placement =
        PlaceJobAfterFault(need, workers_heard_at(1200, 1200, 1200, 900), {}, avoided, 1000);
    CHECK(placement.status().code() == absl::StatusCode::kUnavailable);
    CHECK(absl::StrContains(placement.status().message(), "have not heartbeat since the fault"));
  }
  SECTION("too few others at all: with the avoided ones, better slow than not at all") {
    // d runs another job: only c is free apart from a and b.
    const absl::StatusOr<Placement> placement = PlaceJobAfterFault(
        need, workers_heard_at(1600, 1600, 1200, 1200), {{"d", "job-2"}}, avoided, 1000);
    REQUIRE(placement.ok());
    CHECK(placement->worker_ids == std::vector<std::string>{"c", "a"});  // c, then the shortfall
  }
  SECTION("an avoided worker not heard since the fault is not taken either") {
    const absl::StatusOr<Placement> placement = PlaceJobAfterFault(
        need, workers_heard_at(900, 1600, 1200, 1200), {{"d", "job-2"}}, avoided, 1000);
    REQUIRE(placement.ok());
    CHECK(placement->worker_ids == std::vector<std::string>{"c", "b"});
  }
  SECTION("an avoided worker heard only just after the fault is not taken: it may be dead") {
    // a's last heartbeat, sent before it was killed, was processed 20 ms after the fault; b's
    // came well after it.
    const absl::StatusOr<Placement> placement = PlaceJobAfterFault(
        need, workers_heard_at(1020, 1600, 1200, 1200), {{"d", "job-2"}}, avoided, 1000);
    REQUIRE(placement.ok());
    CHECK(placement->worker_ids == std::vector<std::string>{"c", "b"});
    const absl::StatusOr<Placement> none = PlaceJobAfterFault(
        need, workers_heard_at(1020, 1020, 1200, 1200), {{"d", "job-2"}}, avoided, 1000);
    CHECK_FALSE(none.ok());
  }
  SECTION("nothing avoided: as PlaceJob, its reason when the job does not fit") {
    const absl::StatusOr<Placement> placement =
        PlaceJobAfterFault(need, workers_heard_at(1200, 900, 900, 900), {}, {}, 1000);
    CHECK(placement.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK(placement.status().message() ==
          PlaceJob(need, workers_heard_at(1200, 900, 900, 900), {}, 1000).status().message());
  }
}

}  // namespace rlhfd::controller
