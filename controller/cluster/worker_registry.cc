// Worker registration, heartbeats, drains and the liveness sweep.
#include "controller/cluster/worker_registry.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "common/util/text.h"

namespace rlhfd::controller {
namespace {

// Bounds on what a worker may report; real values are a fraction of these.
constexpr size_t kMaxHostBytes = 253;
constexpr size_t kMaxNameBytes = 256;
constexpr size_t kMaxVersionBytes = 64;
constexpr size_t kMaxInstanceIdBytes = 64;
constexpr int kMaxDeviceIndex = 1023;
// A worker hosts a handful of jobs at a time; a heartbeat listing more is not a worker's.
constexpr int kMaxHostedAttempts = 64;

bool IsValidWorkerId(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '_' && c != '.' && c != ':') return false;
  }
  return true;
}

bool IsValidHostName(absl::string_view host) {
  if (host.empty() || host.size() > kMaxHostBytes) return false;
  for (char c : host) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '.' && c != '_') return false;
  }
  return true;
}

// "9.0", "12.1"; empty for CPU workers.
bool IsValidComputeCapability(const std::string& text) {
  const size_t dot = text.find('.');
  if (text.size() > 8 || dot == std::string::npos || dot == 0 || dot + 1 == text.size()) {
    return false;
  }
  for (size_t i = 0; i < text.size(); ++i) {
    if (i != dot && !absl::ascii_isdigit(text[i])) return false;
  }
  return true;
}

absl::Status Invalid(const std::string& worker_id, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("worker ", worker_id, ": ", message));
}

absl::Status CheckRegistration(const v1::RegisterWorkerRequest& request) {
  const std::string& id = request.worker_id();
  if (!IsValidWorkerId(id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker_id '", SanitizeForDisplay(id, 64),
                     "' must be 1-128 letters, digits, '-', '_', '.' or ':'"));
  }
  if (!IsValidHostPort(request.address())) {
    return Invalid(id, absl::StrCat("address '", SanitizeForDisplay(request.address(), 64),
                                    "' must be host:port with a port in 1..65535"));
  }
  const v1::WorkerCapacity& capacity = request.capacity();
  if (capacity.device_kind() != v1::DEVICE_KIND_CPU &&
      capacity.device_kind() != v1::DEVICE_KIND_CUDA) {
    return Invalid(id, absl::StrCat("capacity.device_kind ", capacity.device_kind(),
                                    " is not a known device kind (cpu or cuda)"));
  }
  const bool cuda = capacity.device_kind() == v1::DEVICE_KIND_CUDA;
  if (cuda ? (capacity.device_index() < 0 || capacity.device_index() > kMaxDeviceIndex)
           : capacity.device_index() != -1) {
    return Invalid(id, absl::StrCat("capacity.device_index ", capacity.device_index(),
                                    cuda ? " must be in 0..1023" : " must be -1 for a CPU worker"));
  }
  if (capacity.memory_total_bytes() < 0 || capacity.memory_free_bytes() < 0 ||
      capacity.memory_free_bytes() > capacity.memory_total_bytes()) {
    return Invalid(id, absl::StrCat("capacity memory must satisfy 0 <= free (",
                                    capacity.memory_free_bytes(), ") <= total (",
                                    capacity.memory_total_bytes(), ")"));
  }
  if (!capacity.host().empty() && !IsValidHostName(capacity.host())) {
    return Invalid(id, "capacity.host must be a host name of at most 253 letters, digits, '-', "
                       "'.' or '_'");
  }
  if (capacity.device_name().size() > kMaxNameBytes) {
    return Invalid(id, absl::StrCat("capacity.device_name is ", capacity.device_name().size(),
                                    " bytes; at most ", kMaxNameBytes));
  }
  if (cuda ? !IsValidComputeCapability(capacity.compute_capability())
           : !capacity.compute_capability().empty()) {
    return Invalid(id, absl::StrCat("capacity.compute_capability '",
                                    SanitizeForDisplay(capacity.compute_capability(), 16),
                                    cuda ? "' must look like 9.0" : "' must be empty on a CPU"));
  }
  if (request.worker_version().size() > kMaxVersionBytes ||
      request.instance_id().size() > kMaxInstanceIdBytes) {
    return Invalid(id, absl::StrCat("worker_version and instance_id take at most ",
                                    kMaxVersionBytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsValidHostPort(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  int port = 0;
  const std::string port_text = address.substr(colon + 1);
  if (port_text.empty() || port_text.size() > 5 || !absl::SimpleAtoi(port_text, &port) ||
      port < 1 || port > 65535 || !absl::ascii_isdigit(port_text[0])) {
    return false;
  }
  const absl::string_view host = absl::string_view(address).substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 4 || host.back() != ']' || host.size() > 47) return false;
    for (char c : host.substr(1, host.size() - 2)) {
      if (!absl::ascii_isxdigit(c) && c != ':' && c != '.') return false;
    }
    return true;
  }
  return IsValidHostName(host);
}

absl::StatusOr<v1::RegisterWorkerReply> WorkerRegistry::Register(
    const v1::RegisterWorkerRequest& request, int64_t now_ms) {
  if (absl::Status valid = CheckRegistration(request); !valid.ok()) return valid;
  auto existing = workers_.find(request.worker_id());
  if (existing != workers_.end()) {
    const Entry& old = existing->second;
    // A second process under a live worker's id would take the entry in turns with the first at
    // every heartbeat. Only the same process (re-registering), or a restart at the same address
    // (which the old process can no longer be serving), may replace it.
    if (old.worker.state() != v1::WORKER_STATE_LOST && old.instance_id != request.instance_id() &&
        old.worker.address() != request.address()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "worker id ", request.worker_id(), " is in use by a live worker at ",
          old.worker.address(), " (last heartbeat ", now_ms - old.worker.last_heartbeat_time_ms(),
          " ms ago); give this worker another --worker_id, or stop the other one (its entry "
          "expires after the liveness window)"));
    }
  }
  Entry& entry = workers_[request.worker_id()];
  v1::Worker& worker = entry.worker;
  const int64_t incarnation = worker.incarnation() + 1;
  const bool known = incarnation > 1;
  worker.set_worker_id(request.worker_id());
  worker.set_address(request.address());
  *worker.mutable_capacity() = request.capacity();
  worker.mutable_capacity()->set_device_name(
      SanitizeForDisplay(request.capacity().device_name(), kMaxNameBytes));
  worker.set_state(drained_.count(request.worker_id()) ? v1::WORKER_STATE_DRAINING
                                                      : v1::WORKER_STATE_ALIVE);
  worker.set_registered_time_ms(now_ms);
  worker.set_last_heartbeat_time_ms(now_ms);
  worker.set_incarnation(incarnation);
  entry.instance_id = request.instance_id();
  entry.lost_since_ms = 0;
  RLOG(INFO) << (known ? "worker re-registered: " : "worker registered: ") << worker.worker_id()
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
    return absl::NotFoundError(absl::StrCat(
        "worker ", SanitizeForDisplay(request.worker_id(), 128), " is not registered; register again"));
  }
  v1::Worker& worker = it->second.worker;
  if (request.incarnation() != worker.incarnation()) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", request.worker_id(),
                                                      ": stale incarnation ",
                                                      request.incarnation(), "; register again"));
  }
  if (worker.state() == v1::WORKER_STATE_LOST) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", request.worker_id(), " was marked lost; register again"));
  }
  if (request.memory_free_bytes() < 0 ||
      request.memory_free_bytes() > worker.capacity().memory_total_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", request.worker_id(), ": memory_free_bytes ", request.memory_free_bytes(),
        " must be in [0, ", worker.capacity().memory_total_bytes(), "]"));
  }
  if (request.hosted_size() > kMaxHostedAttempts) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", request.worker_id(),
                                                   ": hosted lists ", request.hosted_size(),
                                                   " job attempts; at most ", kMaxHostedAttempts));
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
  const int64_t retention_ms = absl::ToInt64Milliseconds(options_.lost_retention);
  for (auto it = workers_.begin(); it != workers_.end();) {
    Entry& entry = it->second;
    v1::Worker& worker = entry.worker;
    if (worker.state() == v1::WORKER_STATE_LOST) {
      if (now_ms - entry.lost_since_ms > retention_ms) {
        RLOG(INFO) << "worker forgotten: " << it->first << " (lost for "
                  << now_ms - entry.lost_since_ms << " ms)";
        it = workers_.erase(it);
        continue;
      }
    } else if (now_ms - worker.last_heartbeat_time_ms() > window_ms) {
      worker.set_state(v1::WORKER_STATE_LOST);
      entry.lost_since_ms = now_ms;
      lost.push_back(it->first);
      RLOG(WARNING) << "worker lost: " << it->first << " (silent for "
                   << now_ms - worker.last_heartbeat_time_ms() << " ms)";
    }
    ++it;
  }
  return lost;
}

absl::StatusOr<v1::Worker> WorkerRegistry::Drain(const std::string& worker_id) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("no worker ", SanitizeForDisplay(worker_id, 128),
                                            "; see `rlhfctl workers`"));
  }
  drained_.insert(worker_id);
  v1::Worker& worker = it->second.worker;
  if (worker.state() == v1::WORKER_STATE_ALIVE) {
    worker.set_state(v1::WORKER_STATE_DRAINING);
    RLOG(INFO) << "worker draining: " << worker_id;
  }
  return worker;
}

absl::StatusOr<v1::Worker> WorkerRegistry::Undrain(const std::string& worker_id) {
  if (drained_.erase(worker_id) == 0) {
    return absl::NotFoundError(absl::StrCat("worker ", SanitizeForDisplay(worker_id, 128),
                                            " is not drained; see `rlhfctl workers`"));
  }
  RLOG(INFO) << "worker undrained: " << worker_id;
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    v1::Worker forgotten;
    forgotten.set_worker_id(worker_id);
    return forgotten;
  }
  v1::Worker& worker = it->second.worker;
  if (worker.state() == v1::WORKER_STATE_DRAINING) worker.set_state(v1::WORKER_STATE_ALIVE);
  return worker;
}

std::vector<v1::Worker> WorkerRegistry::List() const {
  std::vector<v1::Worker> workers;
  workers.reserve(workers_.size());
  for (const auto& [id, entry] : workers_) workers.push_back(entry.worker);
  return workers;
}

}  // namespace rlhfd::controller
