#include "controller/cluster/pool_placement.h"

#include <algorithm>

namespace rlhfd::controller {

std::vector<v1::PoolAssignment> PlacePools(const v1::JobSpec& spec) {
  const v1::RolesSpec& roles = spec.roles();
  const bool colocated = spec.placement() == v1::PLACEMENT_COLOCATED;
  std::vector<v1::PoolAssignment> pools;
  int next = 0;
  const auto add = [&](v1::Role role, int gpus) {
    v1::PoolAssignment pool;
    pool.set_role(role);
    const int first = colocated ? 0 : next;
    for (int i = 0; i < gpus; ++i) pool.add_ranks(first + i);
    if (!colocated) next += gpus;
    pools.push_back(std::move(pool));
  };
  const int actor = std::max(1, roles.actor().gpus());
  add(v1::ROLE_ACTOR, actor);
  if (roles.has_critic()) {
    add(v1::ROLE_CRITIC, colocated ? actor : std::max(1, roles.critic().gpus()));
  }
  if (roles.has_reference()) {
    add(v1::ROLE_REFERENCE, colocated ? actor : std::max(1, roles.reference().gpus()));
  }
  if (!roles.reward().model().empty()) {
    add(v1::ROLE_REWARD, colocated ? actor : std::max(1, roles.reward().gpus()));
  }
  if (roles.has_rollout()) {
    // Generation apart from the actor's ranks, under either placement: its own ranks, last.
    if (colocated) next = actor;
    v1::PoolAssignment pool;
    pool.set_role(v1::ROLE_ROLLOUT);
    for (int i = 0; i < std::max(1, roles.rollout().gpus()); ++i) pool.add_ranks(next + i);
    pools.push_back(std::move(pool));
  }
  return pools;
}

int WorldSize(const std::vector<v1::PoolAssignment>& pools) {
  int size = 0;
  for (const v1::PoolAssignment& pool : pools) {
    for (int rank : pool.ranks()) size = std::max(size, rank + 1);
  }
  return size;
}

const v1::PoolAssignment* FindPool(const std::vector<v1::PoolAssignment>& pools, v1::Role role) {
  for (const v1::PoolAssignment& pool : pools) {
    if (pool.role() == role) return &pool;
  }
  return nullptr;
}

}  // namespace rlhfd::controller
