// Lookups over the traits tables.
#include "common/algorithms/algorithm_traits.h"

#include <string>

namespace rlhfd::algorithms {

const EstimatorTraits* FindEstimator(v1::AdvantageEstimator estimator) {
  for (const EstimatorTraits& row : kEstimators) {
    if (row.estimator == estimator) return &row;
  }
  return nullptr;
}

const EstimatorTraits* FindEstimatorByName(std::string_view name) {
  for (const EstimatorTraits& row : kEstimators) {
    if (row.name == name) return &row;
  }
  return nullptr;
}

const KlModeTraits* FindKlMode(v1::KlMode mode) {
  for (const KlModeTraits& row : kKlModes) {
    if (row.mode == mode) return &row;
  }
  return nullptr;
}

bool NeedsCritic(const v1::AlgorithmSpec& algorithm) {
  const EstimatorTraits* row = FindEstimator(algorithm.adv_estimator());
  return row != nullptr && row->needs_critic;
}

bool NeedsGroups(const v1::AlgorithmSpec& algorithm) {
  const EstimatorTraits* row = FindEstimator(algorithm.adv_estimator());
  return row != nullptr && row->needs_groups;
}

bool NeedsGreedyBaseline(const v1::AlgorithmSpec& algorithm) {
  const EstimatorTraits* row = FindEstimator(algorithm.adv_estimator());
  return row != nullptr && row->needs_greedy_baseline;
}

bool NeedsReference(const v1::AlgorithmSpec& algorithm) {
  const KlModeTraits* row = FindKlMode(algorithm.kl().mode());
  return row != nullptr && row->needs_reference;
}

bool KlPenalizesReward(const v1::AlgorithmSpec& algorithm) {
  const KlModeTraits* row = FindKlMode(algorithm.kl().mode());
  return row != nullptr && row->penalizes_reward;
}

bool KlInLoss(const v1::AlgorithmSpec& algorithm) {
  const KlModeTraits* row = FindKlMode(algorithm.kl().mode());
  return row != nullptr && row->adds_loss_term;
}

std::string EstimatorNames(bool (*keep)(const EstimatorTraits&)) {
  std::string names;
  for (const EstimatorTraits& row : kEstimators) {
    if (!keep(row)) continue;
    if (!names.empty()) names += ", ";
    names.append(row.name.data(), row.name.size());
  }
  return names;
}

}  // namespace rlhfd::algorithms
