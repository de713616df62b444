#include "worker/parallel/layout.h"

#include "absl/strings/str_cat.h"

namespace rlhfd::parallel {

absl::StatusOr<ParallelLayout> ParallelLayout::Create(const std::vector<PoolSpec>& pools) {
  ParallelLayout layout;
  if (pools.empty()) return absl::InvalidArgumentError("a layout needs at least one pool");
  for (const PoolSpec& spec : pools) {
    if (spec.size < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool '", spec.name, "': size must be at least 1, got ", spec.size));
    }
    if (spec.tp < 1 || spec.size % spec.tp != 0) {
      return absl::InvalidArgumentError(absl::StrCat("pool '", spec.name, "': tp ", spec.tp,
                                                     " must divide its ", spec.size, " ranks"));
    }
    for (const Pool& existing : layout.pools_) {
      if (existing.name == spec.name) {
        return absl::InvalidArgumentError(absl::StrCat("pool '", spec.name, "' appears twice"));
      }
    }
    layout.pools_.push_back({spec.name, layout.world_size_, spec.size, spec.tp});
    layout.world_size_ += spec.size;
  }
  return layout;
}

absl::StatusOr<Pool> ParallelLayout::FindPool(const std::string& name) const {
  for (const Pool& pool : pools_) {
    if (pool.name == name) return pool;
  }
  return absl::NotFoundError(absl::StrCat("no pool named '", name, "'"));
}

const Pool& ParallelLayout::PoolOf(int rank) const {
  for (const Pool& pool : pools_) {
    if (rank >= pool.first_rank && rank < pool.first_rank + pool.size) return pool;
  }
  return pools_.back();  // Callers pass ranks in [0, world_size).
}

int ParallelLayout::TpRank(int rank) const {
  const Pool& pool = PoolOf(rank);
  return (rank - pool.first_rank) % pool.tp;
}

int ParallelLayout::DpRank(int rank) const {
  const Pool& pool = PoolOf(rank);
  return (rank - pool.first_rank) / pool.tp;
}

std::vector<int> ParallelLayout::TpGroup(int rank) const {
  const Pool& pool = PoolOf(rank);
  const int first = pool.first_rank + DpRank(rank) * pool.tp;
  std::vector<int> ranks;
  for (int i = 0; i < pool.tp; ++i) ranks.push_back(first + i);
  return ranks;
}

std::vector<int> ParallelLayout::DpGroup(int rank) const {
  const Pool& pool = PoolOf(rank);
  std::vector<int> ranks;
  for (int i = 0; i < pool.dp(); ++i) ranks.push_back(pool.first_rank + i * pool.tp + TpRank(rank));
  return ranks;
}

std::vector<int> ParallelLayout::PoolRanks(int rank) const {
  const Pool& pool = PoolOf(rank);
  std::vector<int> ranks;
  for (int i = 0; i < pool.size; ++i) ranks.push_back(pool.first_rank + i);
  return ranks;
}

}  // namespace rlhfd::parallel
