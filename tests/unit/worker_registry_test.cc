// WorkerRegistry: registration, heartbeats, liveness, re-registration and draining, driven
// directly with explicit times.
#include <catch2/catch.hpp>

#include "controller/cluster/worker_registry.h"

namespace rlhfd::controller {
namespace {

v1::RegisterWorkerRequest Request(const std::string& id) {
  v1::RegisterWorkerRequest request;
  request.set_worker_id(id);
  request.set_address("127.0.0.1:7000");
  request.mutable_capacity()->set_device_kind(v1::DEVICE_KIND_CPU);
  return request;
}

v1::HeartbeatRequest Beat(const std::string& id, int64_t incarnation) {
  v1::HeartbeatRequest request;
  request.set_worker_id(id);
  request.set_incarnation(incarnation);
  return request;
}

}  // namespace

TEST_CASE("workers register, heartbeat and are lost after the window", "[registry]") {
  WorkerRegistry registry({absl::Seconds(1), absl::Seconds(3)});
  auto reply = registry.Register(Request("w0"), 1000);
  REQUIRE(reply.ok());
  CHECK(reply->incarnation() == 1);
  CHECK(reply->heartbeat_interval_ms() == 1000);
  CHECK(reply->liveness_window_ms() == 3000);
  REQUIRE(registry.Register(Request("w1"), 1000).ok());

  REQUIRE(registry.Heartbeat(Beat("w0", 1), 3500).ok());
  CHECK(registry.SweepLiveness(3900).empty());
  // w1 has been silent for 3.1 s > 3 s; w0 heard from 0.6 s ago.
  CHECK(registry.SweepLiveness(4100) == std::vector<std::string>{"w1"});
  CHECK(registry.SweepLiveness(4200).empty());  // Reported once.
  auto workers = registry.List();
  REQUIRE(workers.size() == 2);
  CHECK(workers[0].state() == v1::WORKER_STATE_ALIVE);
  CHECK(workers[1].state() == v1::WORKER_STATE_LOST);

  // A lost worker's heartbeat is refused so that it registers again.
  CHECK(absl::IsFailedPrecondition(registry.Heartbeat(Beat("w1", 1), 4300).status()));
  auto again = registry.Register(Request("w1"), 4400);
  REQUIRE(again.ok());
  CHECK(again->incarnation() == 2);
  CHECK(registry.List()[1].state() == v1::WORKER_STATE_ALIVE);
  CHECK(absl::IsFailedPrecondition(registry.Heartbeat(Beat("w1", 1), 4500).status()));
  CHECK(registry.Heartbeat(Beat("w1", 2), 4500).ok());
}

TEST_CASE("unknown workers are told to register", "[registry]") {
  WorkerRegistry registry({});
  CHECK(absl::IsNotFound(registry.Heartbeat(Beat("ghost", 1), 0).status()));
  CHECK(absl::IsNotFound(registry.Drain("ghost").status()));
}

TEST_CASE("malformed registrations are refused", "[registry]") {
  WorkerRegistry registry({});
  CHECK(absl::IsInvalidArgument(registry.Register(Request(""), 0).status()));
  CHECK(absl::IsInvalidArgument(registry.Register(Request("bad id/with slash"), 0).status()));
  auto no_address = Request("w0");
  no_address.clear_address();
  CHECK(absl::IsInvalidArgument(registry.Register(no_address, 0).status()));
  auto no_device = Request("w0");
  no_device.mutable_capacity()->clear_device_kind();
  CHECK(absl::IsInvalidArgument(registry.Register(no_device, 0).status()));
  CHECK(registry.List().empty());
}

TEST_CASE("a drained worker stays drained when it re-registers", "[registry]") {
  WorkerRegistry registry({});
  REQUIRE(registry.Register(Request("w0"), 0).ok());
  auto drained = registry.Drain("w0");
  REQUIRE(drained.ok());
  CHECK(drained->state() == v1::WORKER_STATE_DRAINING);
  REQUIRE(registry.Register(Request("w0"), 10).ok());
  CHECK(registry.List()[0].state() == v1::WORKER_STATE_DRAINING);
}

}  // namespace rlhfd::controller
