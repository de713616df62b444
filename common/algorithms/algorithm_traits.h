// What each advantage estimator and each KL mode needs from the rest of a step — a critic, groups
// of responses, a greedy baseline, a reference policy, old log-probs — in one table each. The
// config validator, the verl importer and the worker's advantage stage read these rows instead of
// deciding by name. Adding an estimator is a row here plus its class in worker/train/advantage.cc
// (whose registry fails to compile while a row has no class).
#pragma once

#include <string>
#include <string_view>

#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::algorithms {

struct EstimatorTraits {
  v1::AdvantageEstimator estimator;
  std::string_view name;  // algorithm.adv_estimator in configs; verl's name for it
  // Per-token values from a value model (roles.critic), the "values" forward.
  bool needs_critic = false;
  // Compares the responses to one prompt with each other: rollout.n >= 2.
  bool needs_groups = false;
  // Each prompt's greedy response, scored by the rule or remote reward on the actor's workers
  // ("reward_baselines"); a reward model cannot score it yet.
  bool needs_greedy_baseline = false;
  // algorithm.norm_adv_by_std_in_grpo divides by the group's standard deviation.
  bool reads_norm_adv_by_std = false;
};

// One row per estimator of rlhfd.v1.AdvantageEstimator but UNSPECIFIED.
inline constexpr EstimatorTraits kEstimators[] = {
    {.estimator = v1::ADVANTAGE_ESTIMATOR_GAE, .name = "gae", .needs_critic = true},
    {.estimator = v1::ADVANTAGE_ESTIMATOR_GRPO,
     .name = "grpo",
     .needs_groups = true,
     .reads_norm_adv_by_std = true},
    {.estimator = v1::ADVANTAGE_ESTIMATOR_RLOO, .name = "rloo", .needs_groups = true},
    {.estimator = v1::ADVANTAGE_ESTIMATOR_REINFORCE_PLUS_PLUS, .name = "reinforce_plus_plus"},
    {.estimator = v1::ADVANTAGE_ESTIMATOR_REINFORCE_PLUS_PLUS_BASELINE,
     .name = "reinforce_plus_plus_baseline",
     .needs_groups = true},
    {.estimator = v1::ADVANTAGE_ESTIMATOR_REMAX, .name = "remax", .needs_greedy_baseline = true},
    {.estimator = v1::ADVANTAGE_ESTIMATOR_GRPO_PASSK,
     .name = "grpo_passk",
     .needs_groups = true,
     .reads_norm_adv_by_std = true},
    {.estimator = v1::ADVANTAGE_ESTIMATOR_OPO, .name = "opo", .needs_groups = true},
};

struct KlModeTraits {
  v1::KlMode mode;
  std::string_view name;  // algorithm.kl.mode in configs
  // Reference log-probs from roles.reference.
  bool needs_reference = false;
  // The KL of the sampling policy (old log-probs) against the reference is subtracted from the
  // token rewards before the advantages: needs the old-log-prob forward.
  bool penalizes_reward = false;
  // A KL term in the actor's loss (when algorithm.kl.coef > 0).
  bool adds_loss_term = false;
  // verl's defaults: kl_penalty "kl" (k1) for the reward, kl_loss_type "low_var_kl" (k3) for the
  // loss.
  v1::KlEstimator default_estimator = v1::KL_ESTIMATOR_K3;
};

// One row per mode of rlhfd.v1.KlMode but UNSPECIFIED.
inline constexpr KlModeTraits kKlModes[] = {
    {.mode = v1::KL_MODE_IN_REWARD,
     .name = "in_reward",
     .needs_reference = true,
     .penalizes_reward = true,
     .default_estimator = v1::KL_ESTIMATOR_K1},
    {.mode = v1::KL_MODE_LOSS, .name = "loss", .needs_reference = true, .adds_loss_term = true},
    {.mode = v1::KL_MODE_NONE, .name = "none"},
};

// The row of `estimator`; nullptr for UNSPECIFIED or a number no row has.
const EstimatorTraits* FindEstimator(v1::AdvantageEstimator estimator);
// The row whose config name is `name` exactly ("gae"); nullptr when none is.
const EstimatorTraits* FindEstimatorByName(std::string_view name);
// The row of `mode`; nullptr for UNSPECIFIED or a number no row has.
const KlModeTraits* FindKlMode(v1::KlMode mode);

// What a job's algorithm needs, from its rows (false where a row is missing).
bool NeedsCritic(const v1::AlgorithmSpec& algorithm);
bool NeedsGroups(const v1::AlgorithmSpec& algorithm);
bool NeedsGreedyBaseline(const v1::AlgorithmSpec& algorithm);
bool NeedsReference(const v1::AlgorithmSpec& algorithm);
bool KlPenalizesReward(const v1::AlgorithmSpec& algorithm);
// The KL mode puts a term in the actor's loss (weighted by algorithm.kl.coef).
bool KlInLoss(const v1::AlgorithmSpec& algorithm);

// "grpo, rloo, ..." of the estimators for which `keep` holds, for error messages.
std::string EstimatorNames(bool (*keep)(const EstimatorTraits&));

}  // namespace rlhfd::algorithms
