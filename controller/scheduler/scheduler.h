// Gang placement of a job on registered workers: a worker per world rank of its pools (split:
// disjoint sets per role; colocated: the actor's), all of the job's device kind, none draining,
// lost or used by another job. A job that does not fit gets a reason a person understands.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rlhfd/v1/cluster_service.pb.h"
#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::controller {

// What placement needs of a job: a few bytes the job manager keeps for every waiting job, so a
// scheduling pass reads no job record.
struct PlacementNeed {
  // trainer.device: "cuda", "cpu" or "auto".
  std::string device;
  // Workers, one per world rank of the job's pools.
  int world_size = 0;
};
PlacementNeed NeedOf(const v1::JobSpec& spec);

struct Placement {
  std::vector<std::string> worker_ids;  // by world rank
  std::vector<std::string> addresses;   // by world rank
  bool gpu = false;
  // The job's collectives run over NCCL: GPU workers, each on a device of its own. NCCL refuses
  // two ranks on one device, so workers sharing a GPU (same host and device index) talk over
  // sockets, with device tensors staged through host memory.
  bool nccl = false;
  // GPU workers sharing a GPU, the first pair ("gpu0 and gpu1 share GPU 0 of host-a"), said when
  // the job is placed; empty otherwise.
  std::string shared_gpu;
};

// `used` maps a worker id to the job using it. Workers last heard from at or before
// `heard_after_ms` are left out: after a fault, a worker that has not heartbeat since may be the
// one that failed (dead, or hung) even while the registry still counts it alive.
// FAILED_PRECONDITION with the reason when the job does not fit now ("needs 5 CPU workers:
// 3 alive, 2 of them used by job-3").
absl::StatusOr<Placement> PlaceJob(const PlacementNeed& need,
                                   const std::vector<v1::Worker>& workers,
                                   const std::map<std::string, std::string>& used,
                                   int64_t heard_after_ms = 0);

// A job placed again after a fault whose run some workers left unanswered (`avoided`: a stage
// deadline passed on them; they may be hung or throttled, while the registry counts them alive):
// apart from them where enough other workers have heartbeat since the fault (`heard_after_ms`);
// UNAVAILABLE, to be tried again at the next pass, where enough others are alive but some have
// not heartbeat since yet (on a loaded host a heartbeat lags); with the avoided ones where too
// few others are alive at all (better slow than not at all; the others first, the avoided ones
// making up the shortfall), an avoided one only once heard kAvoidedProofOfLifeMs after the fault:
// a heartbeat that a worker sent just before it was killed can be processed after the fault was
// recorded, and must not make the dead worker look alive. Otherwise as PlaceJob.
inline constexpr int64_t kAvoidedProofOfLifeMs = 500;
absl::StatusOr<Placement> PlaceJobAfterFault(const PlacementNeed& need,
                                             const std::vector<v1::Worker>& workers,
                                             const std::map<std::string, std::string>& used,
                                             const std::set<std::string>& avoided,
                                             int64_t heard_after_ms);

}  // namespace rlhfd::controller
