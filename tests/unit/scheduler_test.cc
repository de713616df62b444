// PlaceJob: which workers a job gets, and the collectives' transport it implies.
#include "controller/scheduler/scheduler.h"

#include <catch2/catch.hpp>

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

}  // namespace rlhfd::controller
