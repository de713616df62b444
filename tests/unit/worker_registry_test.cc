// WorkerRegistry: registration, heartbeats, liveness, re-registration and draining, driven
// directly with explicit times.
#include <catch2/catch.hpp>

#include <functional>
#include <set>

#include "controller/cluster/worker_registry.h"

namespace rlhfd::controller {
namespace {

v1::RegisterWorkerRequest Request(const std::string& id) {
  v1::RegisterWorkerRequest request;
  request.set_worker_id(id);
  request.set_address("127.0.0.1:7000");
  request.mutable_capacity()->set_device_kind(v1::DEVICE_KIND_CPU);
  request.mutable_capacity()->set_device_index(-1);
  request.mutable_capacity()->set_memory_total_bytes(1 << 30);
  request.set_instance_id("instance-" + id);
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

TEST_CASE("every field of a registration is checked and bounded", "[registry]") {
  WorkerRegistry registry({});
  const auto refused = [&](const std::function<void(v1::RegisterWorkerRequest&)>& change) {
    v1::RegisterWorkerRequest request = Request("w0");
    change(request);
    return absl::IsInvalidArgument(registry.Register(request, 0).status());
  };
  using R = v1::RegisterWorkerRequest;
  CHECK(refused([](R& r) { r.set_address("no-port"); }));
  CHECK(refused([](R& r) { r.set_address("host:0"); }));
  CHECK(refused([](R& r) { r.set_address("host:65536"); }));
  CHECK(refused([](R& r) { r.set_address("host:+80"); }));
  CHECK(refused([](R& r) { r.set_address("bad host:80"); }));
  CHECK(refused([](R& r) { r.set_address(std::string(300, 'h') + ":80"); }));
  CHECK(refused([](R& r) { r.mutable_capacity()->set_device_kind(static_cast<v1::DeviceKind>(7)); }));
  CHECK(refused([](R& r) { r.mutable_capacity()->set_device_index(0); }));  // CPU: -1
  CHECK(refused([](R& r) { r.mutable_capacity()->set_memory_total_bytes(-1); }));
  CHECK(refused([](R& r) { r.mutable_capacity()->set_memory_free_bytes(2ll << 30); }));
  CHECK(refused([](R& r) { r.mutable_capacity()->set_device_name(std::string(100 << 20, 'x')); }));
  CHECK(refused([](R& r) { r.mutable_capacity()->set_host("evil\x1b[2Jhost"); }));
  CHECK(refused([](R& r) { r.mutable_capacity()->set_compute_capability("9.0"); }));  // CPU
  CHECK(refused([](R& r) { r.set_worker_version(std::string(1000, 'v')); }));
  CHECK(refused([](R& r) {
    r.mutable_capacity()->set_device_kind(v1::DEVICE_KIND_CUDA);
    r.mutable_capacity()->set_device_index(0);
    r.mutable_capacity()->set_compute_capability("nine");
  }));
  CHECK(registry.List().empty());

  // IPv6 and GPU workers are fine; control characters in the device name are kept escaped.
  v1::RegisterWorkerRequest gpu = Request("gpu0");
  gpu.set_address("[::1]:7001");
  gpu.mutable_capacity()->set_device_kind(v1::DEVICE_KIND_CUDA);
  gpu.mutable_capacity()->set_device_index(3);
  gpu.mutable_capacity()->set_compute_capability("9.0");
  gpu.mutable_capacity()->set_device_name("NVIDIA\x1b[31m H200");
  REQUIRE(registry.Register(gpu, 0).ok());
  CHECK(registry.List()[0].capacity().device_name() == "NVIDIA\\x1B[31m H200");

  // A heartbeat's free memory is checked too.
  v1::HeartbeatRequest beat = Beat("gpu0", 1);
  beat.set_memory_free_bytes(-5);
  CHECK(absl::IsInvalidArgument(registry.Heartbeat(beat, 1).status()));
  // And the job attempts it lists are bounded.
  v1::HeartbeatRequest crowded = Beat("gpu0", 1);
  for (int i = 0; i < 64; ++i) crowded.add_hosted()->set_job_id("job-1");
  CHECK(registry.Heartbeat(crowded, 1).ok());
  crowded.add_hosted()->set_job_id("job-1");
  const auto too_many = registry.Heartbeat(crowded, 1);
  CHECK(absl::IsInvalidArgument(too_many.status()));
  CHECK_THAT(std::string(too_many.status().message()), Catch::Contains("at most 64"));
}

TEST_CASE("a second process under a live worker's id is refused", "[registry]") {
  WorkerRegistry registry({absl::Seconds(1), absl::Seconds(3)});
  REQUIRE(registry.Register(Request("w0"), 0).ok());
  v1::RegisterWorkerRequest impostor = Request("w0");
  impostor.set_instance_id("another-process");
  impostor.set_address("127.0.0.1:7999");
  auto refused = registry.Register(impostor, 100);
  CHECK(absl::IsAlreadyExists(refused.status()));
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("in use by a live worker at 127.0.0.1:7000"));
  // The first keeps its incarnation; its heartbeats go on.
  CHECK(registry.Heartbeat(Beat("w0", 1), 200).ok());
  // The same process re-registering (a controller restart), or a restart at the same address,
  // takes the entry over.
  CHECK(registry.Register(Request("w0"), 300)->incarnation() == 2);
  v1::RegisterWorkerRequest restarted = Request("w0");
  restarted.set_instance_id("restarted-process");
  CHECK(registry.Register(restarted, 400)->incarnation() == 3);
  // Once the first is lost, another process may have the id.
  registry.SweepLiveness(4000);
  CHECK(registry.Register(impostor, 4100)->incarnation() == 4);
}

TEST_CASE("a drain lasts through sweeps and re-registrations until undrained", "[registry]") {
  WorkerRegistry registry({absl::Seconds(1), absl::Seconds(3)});
  REQUIRE(registry.Register(Request("w0"), 0).ok());
  auto drained = registry.Drain("w0");
  REQUIRE(drained.ok());
  CHECK(drained->state() == v1::WORKER_STATE_DRAINING);
  REQUIRE(registry.Register(Request("w0"), 10).ok());
  CHECK(registry.List()[0].state() == v1::WORKER_STATE_DRAINING);
  // Lost, then back: still drained.
  CHECK(registry.SweepLiveness(5000) == std::vector<std::string>{"w0"});
  CHECK(registry.List()[0].state() == v1::WORKER_STATE_LOST);
  REQUIRE(registry.Register(Request("w0"), 5100).ok());
  CHECK(registry.List()[0].state() == v1::WORKER_STATE_DRAINING);
  CHECK(registry.drained() == std::set<std::string>{"w0"});

  auto undrained = registry.Undrain("w0");
  REQUIRE(undrained.ok());
  CHECK(undrained->state() == v1::WORKER_STATE_ALIVE);
  CHECK(registry.drained().empty());
  CHECK(absl::IsNotFound(registry.Undrain("w0").status()));
}

TEST_CASE("a registry starts with the drains it is given", "[registry]") {
  WorkerRegistry registry({}, {"w0"});
  REQUIRE(registry.Register(Request("w0"), 0).ok());
  REQUIRE(registry.Register(Request("w1"), 0).ok());
  CHECK(registry.List()[0].state() == v1::WORKER_STATE_DRAINING);
  CHECK(registry.List()[1].state() == v1::WORKER_STATE_ALIVE);
}

TEST_CASE("lost workers are forgotten after the retention", "[registry]") {
  LivenessOptions options{absl::Seconds(1), absl::Seconds(3)};
  options.lost_retention = absl::Seconds(60);
  WorkerRegistry registry(options);
  REQUIRE(registry.Register(Request("w0"), 0).ok());
  registry.SweepLiveness(4000);
  CHECK(registry.List().size() == 1);
  registry.SweepLiveness(63000);
  CHECK(registry.List().size() == 1);
  registry.SweepLiveness(64001);
  CHECK(registry.List().empty());
}

}  // namespace rlhfd::controller
