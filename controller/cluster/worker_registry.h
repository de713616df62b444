// WorkerRegistry: the controller's inventory of workers and their liveness. Not thread-safe: it
// lives on the controller's event loop like the rest of the controller's state.
#pragma once

#include <cstdint>
#include <map>
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
};

class WorkerRegistry {
 public:
  explicit WorkerRegistry(LivenessOptions options) : options_(options) {}

  // Adds or replaces the worker (same id: a restarted worker, or one re-registering after a
  // controller restart) and starts a new incarnation. INVALID_ARGUMENT for a malformed request.
  absl::StatusOr<v1::RegisterWorkerReply> Register(const v1::RegisterWorkerRequest& request,
                                                   int64_t now_ms);

  // Records a heartbeat. NOT_FOUND for an unknown worker and FAILED_PRECONDITION for a stale
  // incarnation or a LOST worker: both tell the worker to register again.
  absl::StatusOr<v1::HeartbeatReply> Heartbeat(const v1::HeartbeatRequest& request,
                                               int64_t now_ms);

  // Marks workers silent past the liveness window LOST; returns their ids.
  std::vector<std::string> SweepLiveness(int64_t now_ms);

  // Stops new work from going to the worker. NOT_FOUND for an unknown id.
  absl::StatusOr<v1::Worker> Drain(const std::string& worker_id);

  // Every worker, sorted by id.
  std::vector<v1::Worker> List() const;

  const LivenessOptions& options() const { return options_; }

 private:
  LivenessOptions options_;
  std::map<std::string, v1::Worker> workers_;
};

}  // namespace rlhfd::controller
