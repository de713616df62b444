#include "worker/roles/job_layout.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/stages/role_names.h"

namespace rlhfd::roles {

absl::StatusOr<JobLayout> JobLayout::Create(
    int world_size, int rank, const google::protobuf::RepeatedPtrField<v1::PoolAssignment>& pools) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not in a world of ", world_size, " ranks"));
  }
  JobLayout layout;
  layout.world_size_ = world_size;
  layout.rank_ = rank;
  std::vector<const RolePool*> pool_of_rank(world_size, nullptr);
  for (const v1::PoolAssignment& pool : pools) {
    const v1::Role role = pool.role();
    if (role == v1::ROLE_UNSPECIFIED || !v1::Role_IsValid(role)) {
      return absl::InvalidArgumentError(absl::StrCat("pools: unknown role ", static_cast<int>(role),
                                                     " (actor, critic, reference, reward)"));
    }
    const char* name = stages::RoleName(role);
    if (layout.Find(role) != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("pools: role ", name, " appears twice"));
    }
    if (pool.ranks().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("pools: the ", name, " pool has no ranks"));
    }
    std::set<int> seen;
    for (int member : pool.ranks()) {
      if (member < 0 || member >= world_size || !seen.insert(member).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "pools: the ", name, " pool lists rank ", member,
            member < 0 || member >= world_size ? absl::StrCat(", outside the world of ", world_size)
                                               : " twice"));
      }
    }
    layout.pools_.push_back({role, std::vector<int>(pool.ranks().begin(), pool.ranks().end())});
  }
  for (const RolePool& pool : layout.pools_) {
    for (int member : pool.ranks) {
      const RolePool*& other = pool_of_rank[member];
      if (other != nullptr && other->ranks != pool.ranks) {
        return absl::InvalidArgumentError(absl::StrCat(
            "pools: rank ", member, " is in the ", stages::RoleName(other->role), " and ",
            stages::RoleName(pool.role),
            " pools, which list different ranks; pools share ranks only when colocated, with "
            "the same ranks"));
      }
      other = &pool;
    }
  }
  for (int member = 0; member < world_size; ++member) {
    if (pool_of_rank[member] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("pools: rank ", member, " is in no pool"));
    }
  }
  if (layout.Find(v1::ROLE_ACTOR) == nullptr) {
    return absl::InvalidArgumentError("pools: a job needs an actor pool");
  }
  return layout;
}

const RolePool* JobLayout::Find(v1::Role role) const {
  for (const RolePool& pool : pools_) {
    if (pool.role == role) return &pool;
  }
  return nullptr;
}

int JobLayout::PositionIn(v1::Role role) const {
  const RolePool* pool = Find(role);
  if (pool == nullptr) return -1;
  const auto at = std::find(pool->ranks.begin(), pool->ranks.end(), rank_);
  return at == pool->ranks.end() ? -1 : static_cast<int>(at - pool->ranks.begin());
}

std::vector<v1::Role> JobLayout::HostedRoles() const {
  std::vector<v1::Role> roles;
  for (const RolePool& pool : pools_) {
    if (PositionIn(pool.role) >= 0) roles.push_back(pool.role);
  }
  return roles;
}

RowRange JobLayout::RowsOf(v1::Role role, int64_t rows) const {
  const int position = PositionIn(role);
  if (position < 0) return {};
  return ContiguousPart(rows, position, static_cast<int64_t>(Find(role)->ranks.size()));
}

absl::StatusOr<JobLayout::TensorParallelPlace> JobLayout::TensorParallelPlaceIn(v1::Role role,
                                                                                int tp) const {
  const int position = PositionIn(role);
  if (position < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank_, " is not in the ", stages::RoleName(role), " pool"));
  }
  const int size = static_cast<int>(Find(role)->ranks.size());
  if (tp < 1 || size % tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor-parallel size ", tp,
                                                   " does not divide the ", stages::RoleName(role),
                                                   " pool of ", size, " ranks"));
  }
  return TensorParallelPlace{.group = position / tp, .slice = position % tp};
}

}  // namespace rlhfd::roles
