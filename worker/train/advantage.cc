// The advantage estimators and their registry.
#include "worker/train/advantage.h"

#include <ATen/ATen.h>

#include <iterator>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/algorithms/algorithm_traits.h"

namespace rlhfd::train {
namespace {

absl::Status Need(const at::Tensor& tensor, const char* name, const char* estimator) {
  if (tensor.defined()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(estimator, " needs ", name));
}

// Sequence scores: the sum of each sequence's token rewards. (B)
at::Tensor Scores(const AdvantageInput& input) { return (input.token_rewards * input.mask).sum(-1); }

// Per-sequence mean, unbiased std and size of its group. Each (B).
struct GroupStats {
  at::Tensor mean, std, size;
};

GroupStats ComputeGroupStats(const at::Tensor& scores, const at::Tensor& group) {
  const int64_t groups = group.max().item<int64_t>() + 1;
  const auto options = scores.options();
  at::Tensor count = at::zeros({groups}, options).index_add_(0, group, at::ones_like(scores));
  at::Tensor sum = at::zeros({groups}, options).index_add_(0, group, scores);
  at::Tensor mean = sum / count.clamp_min(1);
  at::Tensor centered = scores - mean.index_select(0, group);
  at::Tensor sq = at::zeros({groups}, options).index_add_(0, group, centered.pow(2));
  at::Tensor std = (sq / (count - 1).clamp_min(1)).sqrt();
  GroupStats stats{mean.index_select(0, group), std.index_select(0, group),
                   count.index_select(0, group)};
  // A group of one has no spread to compare against: verl uses mean 0, std 1 there.
  const at::Tensor single = stats.size.le(1);
  stats.mean = at::where(single, at::zeros_like(stats.mean), stats.mean);
  stats.std = at::where(single, at::ones_like(stats.std), stats.std);
  return stats;
}

// Discounted reward-to-go within each sequence, skipping padding. (B, T)
at::Tensor DiscountedReturns(const at::Tensor& rewards, const at::Tensor& mask, double gamma) {
  at::Tensor returns = at::zeros_like(rewards);
  at::Tensor running = at::zeros({rewards.size(0)}, rewards.options());
  for (int64_t t = rewards.size(1) - 1; t >= 0; --t) {
    running = rewards.select(1, t) + gamma * running;
    returns.select(1, t).copy_(running);
    running = running * mask.select(1, t);  // Padding after a sequence does not leak back.
  }
  return returns;
}

class Gae final : public AdvantageEstimator {
 public:
  absl::StatusOr<AdvantageOutput> Compute(const AdvantageInput& in) const override {
    if (auto s = Need(in.values, "critic values", "gae"); !s.ok()) return s;
    const at::Tensor& r = in.token_rewards;
    const at::Tensor& v = in.values;
    const at::Tensor& m = in.mask;
    at::Tensor advantages = at::zeros_like(r);
    at::Tensor next_value = at::zeros({r.size(0)}, r.options());
    at::Tensor last_gae = at::zeros({r.size(0)}, r.options());
    for (int64_t t = r.size(1) - 1; t >= 0; --t) {
      const at::Tensor mt = m.select(1, t);
      const at::Tensor delta = r.select(1, t) + in.gamma * next_value - v.select(1, t);
      const at::Tensor gae = delta + in.gamma * in.lam * last_gae;
      // Padding tokens pass the next real token's value and advantage through unchanged.
      next_value = v.select(1, t) * mt + (1 - mt) * next_value;
      last_gae = gae * mt + (1 - mt) * last_gae;
      advantages.select(1, t).copy_(last_gae);
    }
    AdvantageOutput out;
    out.returns = advantages + v;
    out.advantages = MaskedWhiten(advantages, m) * m;
    return out;
  }
};

class Grpo final : public AdvantageEstimator {
 public:
  absl::StatusOr<AdvantageOutput> Compute(const AdvantageInput& in) const override {
    if (auto s = Need(in.group, "the group of each response", "grpo"); !s.ok()) return s;
    const at::Tensor scores = Scores(in);
    const GroupStats stats = ComputeGroupStats(scores, in.group);
    at::Tensor advantage = scores - stats.mean;
    if (in.norm_adv_by_std) advantage = advantage / (stats.std + in.epsilon);
    at::Tensor tokens = advantage.unsqueeze(-1) * in.mask;
    return AdvantageOutput{tokens, tokens};
  }
};

class Rloo final : public AdvantageEstimator {
 public:
  absl::StatusOr<AdvantageOutput> Compute(const AdvantageInput& in) const override {
    if (auto s = Need(in.group, "the group of each response", "rloo"); !s.ok()) return s;
    const at::Tensor scores = Scores(in);
    const GroupStats stats = ComputeGroupStats(scores, in.group);
    // score minus the mean of the other responses to the same prompt: n/(n-1)·(score - mean).
    const at::Tensor n = stats.size;
    at::Tensor advantage = at::where(n.gt(1), (scores - stats.mean) * n / (n - 1).clamp_min(1), scores);
    at::Tensor tokens = advantage.unsqueeze(-1) * in.mask;
    return AdvantageOutput{tokens, tokens};
  }
};

class ReinforcePlusPlus final : public AdvantageEstimator {
 public:
  absl::StatusOr<AdvantageOutput> Compute(const AdvantageInput& in) const override {
    at::Tensor returns = DiscountedReturns(in.token_rewards, in.mask, in.gamma);
    return AdvantageOutput{MaskedWhiten(returns, in.mask) * in.mask, returns};
  }
};

class ReinforcePlusPlusBaseline final : public AdvantageEstimator {
 public:
  absl::StatusOr<AdvantageOutput> Compute(const AdvantageInput& in) const override {
    if (auto s = Need(in.group, "the group of each response", "reinforce_plus_plus_baseline");
        !s.ok()) {
      return s;
    }
    const at::Tensor scores = Scores(in);
    const GroupStats stats = ComputeGroupStats(scores, in.group);
    at::Tensor tokens = (scores - stats.mean).unsqueeze(-1) * in.mask;
    at::Tensor whitened = MaskedWhiten(tokens, in.mask) * in.mask;
    return AdvantageOutput{whitened, whitened};
  }
};

class Remax final : public AdvantageEstimator {
 public:
  absl::StatusOr<AdvantageOutput> Compute(const AdvantageInput& in) const override {
    if (auto s = Need(in.baseline, "the greedy baseline reward of each prompt", "remax"); !s.ok()) {
      return s;
    }
    // verl's reward-to-go over the sampled tokens, with no reset at a masked one: in a multi-turn
    // response the reward reaches the turns before a tool's.
    const at::Tensor returns =
        (in.token_rewards * in.mask).flip({-1}).cumsum(-1).flip({-1}) * in.mask;
    return AdvantageOutput{(returns - in.baseline.unsqueeze(-1)) * in.mask, returns};
  }
};

// Pass@k training (arXiv 2503.19595): only each group's best response is pushed up, by how much
// it beats the runner-up, r_max - r_second_max (over the group's std when norm_adv_by_std).
// Where the best score is tied, that margin is 0, so which of the tied responses verl picks
// does not matter: all of them get 0 here.
class GrpoPassk final : public AdvantageEstimator {
 public:
  absl::StatusOr<AdvantageOutput> Compute(const AdvantageInput& in) const override {
    if (auto s = Need(in.group, "the group of each response", "grpo_passk"); !s.ok()) return s;
    const at::Tensor scores = Scores(in);
    const GroupStats stats = ComputeGroupStats(scores, in.group);
    if (stats.size.min().item<double>() < 2) {
      return absl::InvalidArgumentError(
          "grpo_passk needs at least 2 responses to each prompt (roles.actor.rollout.n >= 2)");
    }
    const int64_t groups = in.group.max().item<int64_t>() + 1;
    const auto group_max = [&](const at::Tensor& values) {
      return at::full({groups}, -std::numeric_limits<double>::infinity(), values.options())
          .scatter_reduce(0, in.group, values, "amax")
          .index_select(0, in.group);
    };
    const at::Tensor best = group_max(scores);
    const at::Tensor is_best = scores.eq(best);
    const at::Tensor best_count = at::zeros({groups}, scores.options())
                                      .index_add_(0, in.group, is_best.to(scores.dtype()))
                                      .index_select(0, in.group);
    // The runner-up: the best again when tied, else the best of the others.
    const at::Tensor others_best = group_max(at::where(
        is_best, at::full_like(scores, -std::numeric_limits<double>::infinity()), scores));
    const at::Tensor runner_up = at::where(best_count.gt(1), best, others_best);
    at::Tensor margin = best - runner_up;
    if (in.norm_adv_by_std) margin = margin / (stats.std + in.epsilon);
    const at::Tensor advantage = at::where(is_best, margin, at::zeros_like(margin));
    at::Tensor tokens = advantage.unsqueeze(-1) * in.mask;
    return AdvantageOutput{tokens, tokens};
  }
};

// OPO (arXiv 2505.23585): the baseline is the group's length-weighted mean score,
// sum(|o| * r) / sum(|o|); a response alone in its group keeps its score. A group whose responses
// are all empty has no weight (verl divides 0 by 0 there); its rows are all padding, so their
// advantages are 0 here either way.
class Opo final : public AdvantageEstimator {
 public:
  absl::StatusOr<AdvantageOutput> Compute(const AdvantageInput& in) const override {
    if (auto s = Need(in.group, "the group of each response", "opo"); !s.ok()) return s;
    const at::Tensor scores = Scores(in);
    const at::Tensor lengths = in.mask.sum(-1);
    const int64_t groups = in.group.max().item<int64_t>() + 1;
    const auto options = scores.options();
    const auto per_group = [&](const at::Tensor& values) {
      return at::zeros({groups}, options).index_add_(0, in.group, values).index_select(0, in.group);
    };
    const at::Tensor size = per_group(at::ones_like(scores));
    const at::Tensor baseline = per_group(lengths * scores) / per_group(lengths).clamp_min(1);
    const at::Tensor advantage = scores - at::where(size.gt(1), baseline, at::zeros_like(baseline));
    at::Tensor tokens = advantage.unsqueeze(-1) * in.mask;
    return AdvantageOutput{tokens, tokens};
  }
};

template <typename Estimator>
std::unique_ptr<AdvantageEstimator> Make() {
  return std::make_unique<Estimator>();
}

struct RegisteredEstimator {
  v1::AdvantageEstimator estimator;
  std::unique_ptr<AdvantageEstimator> (*make)();
};

// The class of each row of algorithms::kEstimators (what the estimator needs is said there).
constexpr RegisteredEstimator kRegistry[] = {
    {v1::ADVANTAGE_ESTIMATOR_GAE, Make<Gae>},
    {v1::ADVANTAGE_ESTIMATOR_GRPO, Make<Grpo>},
    {v1::ADVANTAGE_ESTIMATOR_RLOO, Make<Rloo>},
    {v1::ADVANTAGE_ESTIMATOR_REINFORCE_PLUS_PLUS, Make<ReinforcePlusPlus>},
    {v1::ADVANTAGE_ESTIMATOR_REINFORCE_PLUS_PLUS_BASELINE, Make<ReinforcePlusPlusBaseline>},
    {v1::ADVANTAGE_ESTIMATOR_REMAX, Make<Remax>},
    {v1::ADVANTAGE_ESTIMATOR_GRPO_PASSK, Make<GrpoPassk>},
    {v1::ADVANTAGE_ESTIMATOR_OPO, Make<Opo>},
};

constexpr bool EveryTraitsRowHasAClass() {
  for (const algorithms::EstimatorTraits& row : algorithms::kEstimators) {
    bool found = false;
    for (const RegisteredEstimator& registered : kRegistry) {
      found = found || registered.estimator == row.estimator;
    }
    if (!found) return false;
  }
  return std::size(kRegistry) == std::size(algorithms::kEstimators);
}
static_assert(EveryTraitsRowHasAClass(),
              "each row of algorithms::kEstimators needs one estimator class in kRegistry");

}  // namespace

at::Tensor MaskedWhiten(const at::Tensor& x, const at::Tensor& mask) {
  const at::Tensor count = mask.sum();
  const at::Tensor mean = (x * mask).sum() / count.clamp_min(1);
  const at::Tensor variance = ((x - mean).pow(2) * mask).sum() / (count - 1).clamp_min(1);
  return (x - mean) * at::rsqrt(variance + 1e-8);
}

absl::StatusOr<std::unique_ptr<AdvantageEstimator>> MakeAdvantageEstimator(
    v1::AdvantageEstimator estimator) {
  for (const RegisteredEstimator& registered : kRegistry) {
    if (registered.estimator == estimator) return registered.make();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("no advantage estimator registered for ", v1::AdvantageEstimator_Name(estimator)));
}

}  // namespace rlhfd::train
