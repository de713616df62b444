// WorkerRegistry: the controller's inventory of workers and their liveness. Not thread-safe: it
// lives on the controller's event loop like the rest of the controller's state.
//
// Everything in a registration comes from the network, so each field is checked and bounded
// before it is kept, and text is stored sanitised (no control characters reach a terminal).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rlhfd/v1/cluster_service.pb.h"
#include "rlhfd/v1/worker_service.pb.h"

namespace rlhfd::controller {

struct LivenessOptions {
  // How often workers are told to heartbeat.
  absl::Duration heartbeat_interval = absl::Seconds(2);
  // A worker silent for longer than this is marked LOST.
  absl::Duration liveness_window = absl::Seconds(10);
  // A LOST worker is forgotten this long after it was marked lost.
  absl::Duration lost_retention = absl::Hours(1);
};

// "host:port" or "[v6]:port" with a port in 1..65535; false for anything else.
bool IsValidHostPort(const std::string& address);

class WorkerRegistry {
 public:
  // `drained`: worker ids drained before (kept by the caller's store).
  explicit WorkerRegistry(LivenessOptions options, std::set<std::string> drained = {})
      : options_(options), drained_(std::move(drained)) {}

  // Adds or replaces the worker (same id: a restarted worker, or one re-registering after a
  // controller restart) and starts a new incarnation. INVALID_ARGUMENT names a malformed field;
  // ALREADY_EXISTS when another live process holds the id.
  absl::StatusOr<v1::RegisterWorkerReply> Register(const v1::RegisterWorkerRequest& request,
                                                   int64_t now_ms);

  // Records a heartbeat. NOT_FOUND for an unknown worker and FAILED_PRECONDITION for a stale
  // incarnation or a LOST worker: both tell the worker to register again.
  absl::StatusOr<v1::HeartbeatReply> Heartbeat(const v1::HeartbeatRequest& request,
                                               int64_t now_ms);

  // Marks workers silent past the liveness window LOST (returns their ids) and forgets those
  // lost for longer than the retention.
  std::vector<std::string> SweepLiveness(int64_t now_ms);

  // Whether the worker is registered (in any state).
  bool Contains(const std::string& worker_id) const { return workers_.count(worker_id) > 0; }
  // The drained ids, registered or not.
  const std::set<std::string>& drained() const { return drained_; }

  // Stops new work from going to the worker, until Undrain; the caller has persisted the drain.
  // NOT_FOUND for an unknown id.
  absl::StatusOr<v1::Worker> Drain(const std::string& worker_id);
  // Lifts a drain. NOT_FOUND if the worker is not drained.
  absl::StatusOr<v1::Worker> Undrain(const std::string& worker_id);

  // Every worker, sorted by id.
  std::vector<v1::Worker> List() const;

  const LivenessOptions& options() const { return options_; }

 private:
  struct Entry {
    v1::Worker worker;
    std::string instance_id;
    int64_t lost_since_ms = 0;
  };

  LivenessOptions options_;
  std::map<std::string, Entry> workers_;
  std::set<std::string> drained_;
};

}  // namespace rlhfd::controller
