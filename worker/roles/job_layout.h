// Where a job's roles live: pools of world ranks per role (colocated pools list the same ranks),
// this worker's rank, and which of a batch's rows each rank holds.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "common/util/row_split.h"
#include "rlhfd/v1/worker_service.pb.h"

namespace rlhfd::roles {

struct RolePool {
  v1::Role role = v1::ROLE_UNSPECIFIED;
  std::vector<int> ranks;  // world ranks in data-parallel order
};

class JobLayout {
 public:
  // INVALID_ARGUMENT naming the pool and what is wrong: an unknown role, a rank out of range or
  // twice in a pool, a rank in no pool, or a rank in two pools that differ (only colocated pools,
  // which list the same ranks, may share one).
  static absl::StatusOr<JobLayout> Create(
      int world_size, int rank,
      const google::protobuf::RepeatedPtrField<v1::PoolAssignment>& pools);

  int world_size() const { return world_size_; }
  int rank() const { return rank_; }
  const std::vector<RolePool>& pools() const { return pools_; }
  // Null when the job has no such pool.
  const RolePool* Find(v1::Role role) const;
  bool Hosts(v1::Role role) const { return PositionIn(role) >= 0; }
  // This rank's data-parallel position in the role's pool, -1 when it is not in it.
  int PositionIn(v1::Role role) const;
  // The roles this rank hosts.
  std::vector<v1::Role> HostedRoles() const;
  // The rows of an N-row batch this rank holds as a member of `role`'s pool (empty if not one).
  RowRange RowsOf(v1::Role role, int64_t rows) const;

  // Where this rank sits when `role`'s pool is cut into tensor-parallel groups of `tp`
  // consecutive positions (consecutive ranks, so a group stays on one host): which group, and
  // which slice of the weights within it. INVALID_ARGUMENT when tp does not divide the pool or
  // this rank is not in it.
  struct TensorParallelPlace {
    int group = 0;
    int slice = 0;
  };
  absl::StatusOr<TensorParallelPlace> TensorParallelPlaceIn(v1::Role role, int tp) const;

 private:
  int world_size_ = 0;
  int rank_ = 0;
  std::vector<RolePool> pools_;
};

}  // namespace rlhfd::roles
