// Which world ranks each of a job's pools gets, from its spec: split placement numbers the
// actor's ranks first, then the critic's, the reference's and the reward model's; colocated
// placement gives every pool the actor's ranks. A rollout pool of its own (roles.rollout) comes
// last, on ranks of its own under either placement. Rule and remote rewards have no pool (they
// run on the actor ranks).
#pragma once

#include <vector>

#include "rlhfd/v1/job_spec.pb.h"
#include "rlhfd/v1/worker_service.pb.h"

namespace rlhfd::controller {

std::vector<v1::PoolAssignment> PlacePools(const v1::JobSpec& spec);

// Ranks of the world the pools span.
int WorldSize(const std::vector<v1::PoolAssignment>& pools);

// The pool of `role` (nullptr when the job has none).
const v1::PoolAssignment* FindPool(const std::vector<v1::PoolAssignment>& pools, v1::Role role);

}  // namespace rlhfd::controller
