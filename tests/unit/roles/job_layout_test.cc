// Where a job's ranks sit, from the controller's placement (PlacePools) through the layout each
// worker builds from it (JobLayout): pools in split and colocated placement, data-parallel
// positions, rows, and the rollout's tensor-parallel places, against hand-written expectations.
#include "worker/roles/job_layout.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "controller/cluster/pool_placement.h"

namespace rlhfd::roles {
namespace {

using google::protobuf::RepeatedPtrField;

// actor 4 GPUs (rollout tp 2), critic 2, reference 1, reward model 1.
v1::JobSpec FourPoolSpec(v1::Placement placement) {
  v1::JobSpec spec;
  spec.set_placement(placement);
  spec.mutable_roles()->mutable_actor()->set_gpus(4);
  spec.mutable_roles()->mutable_actor()->mutable_rollout()->set_tp(2);
  spec.mutable_roles()->mutable_critic()->set_gpus(2);
  spec.mutable_roles()->mutable_reference()->set_gpus(1);
  spec.mutable_roles()->mutable_reward()->set_model("/models/rm");
  spec.mutable_roles()->mutable_reward()->set_gpus(1);
  return spec;
}

RepeatedPtrField<v1::PoolAssignment> Placed(const v1::JobSpec& spec) {
  const std::vector<v1::PoolAssignment> pools = controller::PlacePools(spec);
  return RepeatedPtrField<v1::PoolAssignment>(pools.begin(), pools.end());
}

JobLayout LayoutOf(const RepeatedPtrField<v1::PoolAssignment>& pools, int rank) {
  std::vector<v1::PoolAssignment> list(pools.begin(), pools.end());
  auto layout = JobLayout::Create(controller::WorldSize(list), rank, pools);
  REQUIRE(layout.ok());
  return *std::move(layout);
}

TEST_CASE("split placement: pools numbered in order, positions and tensor-parallel places",
          "[roles]") {
  const auto pools = Placed(FourPoolSpec(v1::PLACEMENT_SPLIT));
  const JobLayout rank3 = LayoutOf(pools, 3);
  CHECK(rank3.world_size() == 8);
  CHECK(rank3.Find(v1::ROLE_CRITIC)->ranks == std::vector<int>{4, 5});
  CHECK(rank3.Find(v1::ROLE_REFERENCE)->ranks == std::vector<int>{6});
  CHECK(rank3.Find(v1::ROLE_REWARD)->ranks == std::vector<int>{7});
  CHECK(rank3.HostedRoles() == std::vector<v1::Role>{v1::ROLE_ACTOR});
  CHECK(rank3.PositionIn(v1::ROLE_ACTOR) == 3);
  CHECK(rank3.PositionIn(v1::ROLE_CRITIC) == -1);
  // Actor positions 0-1 form tensor-parallel group 0, 2-3 group 1; slice = position in group.
  const auto place = rank3.TensorParallelPlaceIn(v1::ROLE_ACTOR, 2);
  REQUIRE(place.ok());
  CHECK(place->group == 1);
  CHECK(place->slice == 1);
  const auto first = LayoutOf(pools, 2).TensorParallelPlaceIn(v1::ROLE_ACTOR, 2);
  REQUIRE(first.ok());
  CHECK(first->group == 1);
  CHECK(first->slice == 0);
  // 10 rows over 4 actor ranks: the last holds rows 8 and 9.
  CHECK(rank3.RowsOf(v1::ROLE_ACTOR, 10).begin == 8);
  CHECK(rank3.RowsOf(v1::ROLE_ACTOR, 10).end == 10);
  CHECK(rank3.RowsOf(v1::ROLE_CRITIC, 10).end == 0);

  const JobLayout rank5 = LayoutOf(pools, 5);
  CHECK(rank5.PositionIn(v1::ROLE_CRITIC) == 1);
  CHECK(rank5.RowsOf(v1::ROLE_CRITIC, 10).begin == 5);
  CHECK(rank5.TensorParallelPlaceIn(v1::ROLE_CRITIC, 1)->group == 1);
  CHECK(LayoutOf(pools, 7).HostedRoles() == std::vector<v1::Role>{v1::ROLE_REWARD});

  // tp must divide the pool, and the rank must be in it.
  const auto uneven = rank3.TensorParallelPlaceIn(v1::ROLE_ACTOR, 3);
  REQUIRE_FALSE(uneven.ok());
  CHECK_THAT(std::string(uneven.status().message()),
             Catch::Contains("tensor-parallel size 3 does not divide the actor pool of 4"));
  CHECK_THAT(std::string(rank3.TensorParallelPlaceIn(v1::ROLE_CRITIC, 1).status().message()),
             Catch::Contains("rank 3 is not in the critic pool"));
}

TEST_CASE("colocated placement: every pool on the actor's ranks", "[roles]") {
  const auto pools = Placed(FourPoolSpec(v1::PLACEMENT_COLOCATED));
  const JobLayout rank1 = LayoutOf(pools, 1);
  CHECK(rank1.world_size() == 4);
  CHECK(rank1.HostedRoles() == std::vector<v1::Role>{v1::ROLE_ACTOR, v1::ROLE_CRITIC,
                                                     v1::ROLE_REFERENCE, v1::ROLE_REWARD});
  CHECK(rank1.PositionIn(v1::ROLE_REWARD) == 1);
  CHECK(rank1.TensorParallelPlaceIn(v1::ROLE_ACTOR, 2)->slice == 1);
}

TEST_CASE("a rollout pool of its own: ranks after every other pool's, under either placement",
          "[roles]") {
  for (const v1::Placement placement : {v1::PLACEMENT_SPLIT, v1::PLACEMENT_COLOCATED}) {
    v1::JobSpec spec = FourPoolSpec(placement);
    spec.mutable_roles()->mutable_rollout()->set_gpus(2);
    const auto pools = Placed(spec);
    const int first = placement == v1::PLACEMENT_SPLIT ? 8 : 4;
    INFO("first rollout rank " << first);
    const JobLayout layout = LayoutOf(pools, first + 1);
    CHECK(layout.world_size() == first + 2);
    CHECK(layout.Find(v1::ROLE_ROLLOUT)->ranks == std::vector<int>{first, first + 1});
    CHECK(layout.HostedRoles() == std::vector<v1::Role>{v1::ROLE_ROLLOUT});
    CHECK(layout.PositionIn(v1::ROLE_ROLLOUT) == 1);
    CHECK(layout.RowsOf(v1::ROLE_ROLLOUT, 10).begin == 5);
    CHECK(LayoutOf(pools, 0).PositionIn(v1::ROLE_ROLLOUT) == -1);
  }
}

TEST_CASE("a layout refuses pools that do not describe one world", "[roles]") {
  const auto pool = [](v1::Role role, std::vector<int> ranks) {
    v1::PoolAssignment assignment;
    assignment.set_role(role);
    for (int rank : ranks) assignment.add_ranks(rank);
    return assignment;
  };
  const auto error = [](int world, std::vector<v1::PoolAssignment> list) {
    const RepeatedPtrField<v1::PoolAssignment> pools(list.begin(), list.end());
    const auto layout = JobLayout::Create(world, 0, pools);
    REQUIRE_FALSE(layout.ok());
    return std::string(layout.status().message());
  };
  CHECK_THAT(error(4, {pool(v1::ROLE_ACTOR, {0, 1}), pool(v1::ROLE_ACTOR, {2, 3})}),
             Catch::Contains("role actor appears twice"));
  CHECK_THAT(error(2, {pool(v1::ROLE_ACTOR, {0}), pool(v1::ROLE_CRITIC, {})}),
             Catch::Contains("the critic pool has no ranks"));
  CHECK_THAT(error(2, {pool(v1::ROLE_ACTOR, {0, 2})}), Catch::Contains("outside the world of 2"));
  CHECK_THAT(error(3, {pool(v1::ROLE_ACTOR, {0, 1}), pool(v1::ROLE_CRITIC, {1, 2})}),
             Catch::Contains("pools share ranks only when colocated"));
  CHECK_THAT(error(3, {pool(v1::ROLE_ACTOR, {0, 1})}), Catch::Contains("rank 2 is in no pool"));
  CHECK_THAT(error(1, {pool(v1::ROLE_CRITIC, {0})}), Catch::Contains("a job needs an actor pool"));
}

}  // namespace
}  // namespace rlhfd::roles
