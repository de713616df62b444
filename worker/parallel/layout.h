// Where every rank of a job sits: the world is cut into pools (actor, critic, reference, reward),
// each pool into tensor-parallel groups of consecutive ranks (so a group stays on one host) and
// data-parallel groups across them. Every part that forms groups or plans transfers reads this
// one object.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rlhfd::parallel {

struct PoolSpec {
  std::string name;  // "actor", "critic", "reference", "reward"
  int size = 1;      // ranks (GPUs)
  int tp = 1;        // tensor-parallel size; divides size
};

struct Pool {
  std::string name;
  int first_rank = 0;
  int size = 1;
  int tp = 1;
  int dp() const { return size / tp; }
};

class ParallelLayout {
 public:
  // Pools in order, ranks numbered consecutively. Errors name the pool and what to fix.
  static absl::StatusOr<ParallelLayout> Create(const std::vector<PoolSpec>& pools);

  int world_size() const { return world_size_; }
  const std::vector<Pool>& pools() const { return pools_; }
  absl::StatusOr<Pool> FindPool(const std::string& name) const;
  const Pool& PoolOf(int rank) const;

  // Within the rank's pool: tp rank = position in its tensor-parallel group, dp rank = which
  // group. Groups list world ranks in rank order.
  int TpRank(int rank) const;
  int DpRank(int rank) const;
  std::vector<int> TpGroup(int rank) const;
  std::vector<int> DpGroup(int rank) const;
  std::vector<int> PoolRanks(int rank) const;

 private:
  std::vector<Pool> pools_;
  int world_size_ = 0;
};

}  // namespace rlhfd::parallel
