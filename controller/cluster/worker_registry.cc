// Worker registration, heartbeats and the liveness sweep.
#include "controller/cluster/worker_registry.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"

namespace rlhfd::controller {
namespace {

bool IsValidWorkerId(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '_' && c != '.' && c != ':') return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<v1::RegisterWorkerReply> WorkerRegistry::Register(
    const v1::RegisterWorkerRequest& request, int64_t now_ms) {
  if (!IsValidWorkerId(request.worker_id())) {
    return absl::InvalidArgumentError(
        "worker_id must be 1-128 letters, digits, '-', '_', '.' or ':'");
  }
  if (request.address().empty() || request.address().size() > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", request.worker_id(), ": address must be host:port"));
  }
  if (request.capacity().device_kind() == v1::DEVICE_KIND_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", request.worker_id(), ": capacity.device_kind is required"));
  }
  v1::Worker& worker = workers_[request.worker_id()];
  const int64_t incarnation = worker.incarnation() + 1;
  const bool known = incarnation > 1;
  worker.set_worker_id(request.worker_id());
  worker.set_address(request.address());
  *worker.mutable_capacity() = request.capacity();
  // A drained worker stays drained across its restarts.
  worker.set_state(worker.state() == v1::WORKER_STATE_DRAINING ? v1::WORKER_STATE_DRAINING
                                                                : v1::WORKER_STATE_ALIVE);
  worker.set_registered_time_ms(now_ms);
  worker.set_last_heartbeat_time_ms(now_ms);
  worker.set_incarnation(incarnation);
  LOG(INFO) << (known ? "worker re-registered: " : "worker registered: ") << worker.worker_id()
            << " at " << worker.address() << " ("
            << v1::DeviceKind_Name(worker.capacity().device_kind()) << " "
            << worker.capacity().device_name() << ", incarnation " << incarnation << ")";

  v1::RegisterWorkerReply reply;
  reply.set_incarnation(incarnation);
  reply.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  reply.set_liveness_window_ms(absl::ToInt64Milliseconds(options_.liveness_window));
  return reply;
}

absl::StatusOr<v1::HeartbeatReply> WorkerRegistry::Heartbeat(const v1::HeartbeatRequest& request,
                                                             int64_t now_ms) {
  auto it = workers_.find(request.worker_id());
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("worker ", request.worker_id(), " is not registered; register again"));
  }
  v1::Worker& worker = it->second;
  if (request.incarnation() != worker.incarnation()) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", request.worker_id(),
                                                      ": stale incarnation ",
                                                      request.incarnation(), "; register again"));
  }
  if (worker.state() == v1::WORKER_STATE_LOST) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", request.worker_id(), " was marked lost; register again"));
  }
  worker.set_last_heartbeat_time_ms(now_ms);
  worker.mutable_capacity()->set_memory_free_bytes(request.memory_free_bytes());
  v1::HeartbeatReply reply;
  reply.set_state(worker.state());
  return reply;
}

std::vector<std::string> WorkerRegistry::SweepLiveness(int64_t now_ms) {
  std::vector<std::string> lost;
  const int64_t window_ms = absl::ToInt64Milliseconds(options_.liveness_window);
  for (auto& [id, worker] : workers_) {
    if (worker.state() != v1::WORKER_STATE_LOST &&
        now_ms - worker.last_heartbeat_time_ms() > window_ms) {
      worker.set_state(v1::WORKER_STATE_LOST);
      lost.push_back(id);
      LOG(WARNING) << "worker lost: " << id << " (silent for "
                   << now_ms - worker.last_heartbeat_time_ms() << " ms)";
    }
  }
  return lost;
}

absl::StatusOr<v1::Worker> WorkerRegistry::Drain(const std::string& worker_id) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("no worker ", worker_id, "; see `rlhfctl workers`"));
  }
  if (it->second.state() == v1::WORKER_STATE_ALIVE) {
    it->second.set_state(v1::WORKER_STATE_DRAINING);
    LOG(INFO) << "worker draining: " << worker_id;
  }
  return it->second;
}

std::vector<v1::Worker> WorkerRegistry::List() const {
  std::vector<v1::Worker> workers;
  workers.reserve(workers_.size());
  for (const auto& [id, worker] : workers_) workers.push_back(worker);
  return workers;
}

}  // namespace rlhfd::controller
