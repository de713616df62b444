// The traits tables: one row for every estimator and KL mode of the proto, named as configs name
// them, and the needs the validator reads from them.
#include "common/algorithms/algorithm_traits.h"

#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "common/config/proto_json_schema.h"

namespace rlhfd::algorithms {
namespace {

TEST_CASE("every advantage estimator of the proto has one traits row, under its config name",
          "[algorithms]") {
  const auto* type = v1::AdvantageEstimator_descriptor();
  std::set<int> rows;
  for (const EstimatorTraits& row : kEstimators) {
    INFO(row.name);
    CHECK(rows.insert(row.estimator).second);
    const auto* value = type->FindValueByNumber(row.estimator);
    REQUIRE(value != nullptr);
    CHECK(config::EnumConfigName(*value) == row.name);
    CHECK(FindEstimatorByName(row.name) == &row);
  }
  CHECK(rows.size() == static_cast<size_t>(type->value_count() - 1));  // all but UNSPECIFIED
  CHECK(FindEstimator(v1::ADVANTAGE_ESTIMATOR_UNSPECIFIED) == nullptr);
  CHECK(FindEstimatorByName("GAE") == nullptr);
}

TEST_CASE("every KL mode of the proto has one traits row, under its config name", "[algorithms]") {
  const auto* type = v1::KlMode_descriptor();
  std::set<int> rows;
  for (const KlModeTraits& row : kKlModes) {
    INFO(row.name);
    CHECK(rows.insert(row.mode).second);
    const auto* value = type->FindValueByNumber(row.mode);
    REQUIRE(value != nullptr);
    CHECK(config::EnumConfigName(*value) == row.name);
  }
  CHECK(rows.size() == static_cast<size_t>(type->value_count() - 1));
}

TEST_CASE("what each algorithm needs", "[algorithms]") {
  v1::AlgorithmSpec algorithm;
  algorithm.set_adv_estimator(v1::ADVANTAGE_ESTIMATOR_GAE);
  CHECK(NeedsCritic(algorithm));
  CHECK_FALSE(NeedsGroups(algorithm));
  algorithm.set_adv_estimator(v1::ADVANTAGE_ESTIMATOR_GRPO);
  CHECK_FALSE(NeedsCritic(algorithm));
  CHECK(NeedsGroups(algorithm));
  algorithm.set_adv_estimator(v1::ADVANTAGE_ESTIMATOR_REMAX);
  CHECK(NeedsGreedyBaseline(algorithm));
  CHECK_FALSE(NeedsGroups(algorithm));

  algorithm.mutable_kl()->set_mode(v1::KL_MODE_NONE);
  CHECK_FALSE(NeedsReference(algorithm));
  algorithm.mutable_kl()->set_mode(v1::KL_MODE_LOSS);
  CHECK(NeedsReference(algorithm));
  CHECK_FALSE(KlPenalizesReward(algorithm));
  CHECK(FindKlMode(v1::KL_MODE_LOSS)->default_estimator == v1::KL_ESTIMATOR_K3);
  algorithm.mutable_kl()->set_mode(v1::KL_MODE_IN_REWARD);
  CHECK(NeedsReference(algorithm));
  CHECK(KlPenalizesReward(algorithm));
  CHECK(FindKlMode(v1::KL_MODE_IN_REWARD)->default_estimator == v1::KL_ESTIMATOR_K1);

  CHECK(EstimatorNames([](const EstimatorTraits& row) { return row.needs_critic; }) == "gae");
}

}  // namespace
}  // namespace rlhfd::algorithms
