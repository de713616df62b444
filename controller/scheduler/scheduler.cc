#include "controller/scheduler/scheduler.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/cluster/pool_placement.h"

namespace rlhfd::controller {

PlacementNeed NeedOf(const v1::JobSpec& spec) {
  return {.device = spec.trainer().device(), .world_size = WorldSize(PlacePools(spec))};
}

absl::StatusOr<Placement> PlaceJob(const PlacementNeed& need,
                                   const std::vector<v1::Worker>& workers,
                                   const std::map<std::string, std::string>& used,
                                   int64_t heard_after_ms) {
  bool any_gpu = false;
  for (const v1::Worker& worker : workers) {
    if (worker.state() != v1::WORKER_STATE_LOST &&
        worker.capacity().device_kind() == v1::DEVICE_KIND_CUDA) {
      any_gpu = true;
    }
  }
  const std::string& device = need.device;
  const bool gpu = device == "cuda" || (device != "cpu" && any_gpu);
  const v1::DeviceKind kind = gpu ? v1::DEVICE_KIND_CUDA : v1::DEVICE_KIND_CPU;
  const int needed = need.world_size;
  Placement placement;
  placement.gpu = gpu;
  int alive = 0, draining = 0, silent = 0;
  std::set<std::string> busy_jobs;
  int busy = 0;
  std::vector<const v1::Worker*> eligible;
  for (const v1::Worker& worker : workers) {
    if (worker.capacity().device_kind() != kind) continue;
    if (worker.state() == v1::WORKER_STATE_DRAINING) ++draining;
    if (worker.state() != v1::WORKER_STATE_ALIVE) continue;
    ++alive;
    if (worker.last_heartbeat_time_ms() <= heard_after_ms) {
      ++silent;
      continue;
    }
    if (const auto user = used.find(worker.worker_id()); user != used.end()) {
      ++busy;
      busy_jobs.insert(user->second);
      continue;
    }
    eligible.push_back(&worker);
  }
  // GPU workers on GPUs of their own first: two ranks on one GPU make the whole job's collectives
  // run over sockets (NCCL refuses them).
  std::map<std::pair<std::string, int>, std::string> devices_taken;  // → the worker placed there
  const auto place = [&](const v1::Worker& worker) {
    placement.worker_ids.push_back(worker.worker_id());
    placement.addresses.push_back(worker.address());
    if (!gpu) return;
    const v1::WorkerCapacity& capacity = worker.capacity();
    const auto [taken, fresh] = devices_taken.emplace(
        std::pair{capacity.host(), capacity.device_index()}, worker.worker_id());
    if (!fresh && placement.shared_gpu.empty()) {
      placement.shared_gpu = absl::StrCat(taken->second, " and ", worker.worker_id(), " share GPU ",
                                          capacity.device_index(), " of ", capacity.host());
    }
  };
  std::vector<const v1::Worker*> sharing;
  for (const v1::Worker* worker : eligible) {
    if (static_cast<int>(placement.worker_ids.size()) == needed) break;
    const v1::WorkerCapacity& capacity = worker->capacity();
    if (gpu && devices_taken.count({capacity.host(), capacity.device_index()})) {
      sharing.push_back(worker);
    } else {
      place(*worker);
    }
  }
  for (const v1::Worker* worker : sharing) {
    if (static_cast<int>(placement.worker_ids.size()) == needed) break;
    place(*worker);
  }
  placement.nccl = gpu && placement.shared_gpu.empty();
  if (static_cast<int>(placement.worker_ids.size()) == needed) return placement;
  const char* what = gpu ? "GPU" : "CPU";
  std::string reason = absl::StrCat("needs ", needed, " ", what, " worker", needed == 1 ? "" : "s",
                                    ": ", alive, " alive");
  if (busy > 0) {
    absl::StrAppend(&reason, ", ", busy, " of them used by ", absl::StrJoin(busy_jobs, ", "));
  }
  if (silent > 0) {
    absl::StrAppend(&reason, ", ", silent, " of them not heard from since the job's fault");
  }
  if (draining > 0) absl::StrAppend(&reason, ", ", draining, " draining");
  return absl::FailedPreconditionError(reason);
}

absl::StatusOr<Placement> PlaceJobAfterFault(const PlacementNeed& need,
                                             const std::vector<v1::Worker>& workers,
                                             const std::map<std::string, std::string>& used,
                                             const std::set<std::string>& avoided,
                                             int64_t heard_after_ms) {
  std::map<std::string, std::string> used_or_avoided = used;
  for (const std::string& worker : avoided) used_or_avoided.emplace(worker, "avoided");
  absl::StatusOr<Placement> apart = PlaceJob(need, workers, used_or_avoided, heard_after_ms);
  if (apart.ok() || avoided.empty()) return apart;
  if (PlaceJob(need, workers, used_or_avoided).ok()) {
    return absl::UnavailableError(
        "the workers apart from those that left the last run unanswered have not heartbeat "
        "since the fault yet");
  }
  // The others first, so that only the shortfall is made up of avoided workers, and of those only
  // the ones heard well after the fault.
  std::vector<v1::Worker> others_first;
  for (const v1::Worker& worker : workers) {
    if (!avoided.count(worker.worker_id())) others_first.push_back(worker);
  }
  for (const v1::Worker& worker : workers) {
    if (avoided.count(worker.worker_id()) &&
        worker.last_heartbeat_time_ms() > heard_after_ms + kAvoidedProofOfLifeMs) {
      others_first.push_back(worker);
    }
  }
  return PlaceJob(need, others_first, used, heard_after_ms);
}

}  // namespace rlhfd::controller
