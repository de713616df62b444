// The rollout correction's importance weights and metrics against hand-worked cases (verl's
// compute_rollout_correction_weights formulas), over one replica and split over two; verl's
// rollout-vs-trainer probability metrics by hand and against torch's std and corrcoef; and
// log-probs at a sampling temperature against log_softmax(logits / T) in float64.
#include "worker/train/rollout_correction.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "worker/train/chunked_log_probs.h"
#include "worker/train/losses.h"

namespace rlhfd::train {
namespace {

at::Tensor Rows(const std::vector<std::vector<double>>& rows) {
  std::vector<double> flat;
  for (const auto& row : rows) flat.insert(flat.end(), row.begin(), row.end());
  return at::tensor(flat, at::kDouble)
      .reshape({static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())})
      .to(at::kFloat);
}

// One replica: the sums and maxima are this rank's.
absl::Status Alone(std::vector<double>&, bool) { return absl::OkStatus(); }

// Rollout log-probs 0, old log-probs the log-ratios d: row 0 has d = ln 3, ln 0.6, 0 (three
// tokens), row 1 has d = ln 0.25 (one token) and padding.
const double kLn3 = std::log(3.0), kLn06 = std::log(0.6), kLnQuarter = std::log(0.25);
at::Tensor Old() { return Rows({{kLn3, kLn06, 0.0}, {kLnQuarter, 0.0, 0.0}}); }
at::Tensor Rollout() { return at::zeros({2, 3}); }
at::Tensor Mask() { return Rows({{1, 1, 1}, {1, 0, 0}}); }

TEST_CASE("rollout correction, token level: min(exp(d), threshold), zero past responses",
          "[train][rollout_correction]") {
  auto corrected = ComputeRolloutCorrection(Old(), Rollout(), Mask(), {.threshold = 2.0}, Alone);
  REQUIRE(corrected.ok());
  // 3 is truncated to 2; 0.6, 1 and 0.25 stay; padding is 0.
  CHECK(at::allclose(corrected->weights, Rows({{2.0, 0.6, 1.0}, {0.25, 0, 0}}), 0, 1e-6));
  const auto& m = corrected->metrics;
  CHECK(m.at("rollout_corr/rollout_is_mean") == Approx((2 + 0.6 + 1 + 0.25) / 4));
  CHECK(m.at("rollout_corr/rollout_is_max") == Approx(2.0));
  CHECK(m.at("rollout_corr/rollout_is_min") == Approx(0.25));
  // Raw weights above 2: one (3) of four tokens; below 1/2: one (0.25).
  CHECK(m.at("rollout_corr/rollout_is_ratio_fraction_high") == Approx(0.25));
  CHECK(m.at("rollout_corr/rollout_is_ratio_fraction_low") == Approx(0.25));
  // kl = mean(rollout - old); k3 = mean(exp(d) - d - 1).
  CHECK(m.at("rollout_corr/kl") == Approx(-(kLn3 + kLn06 + kLnQuarter) / 4));
  CHECK(m.at("rollout_corr/k3_kl") ==
        Approx(((3 - kLn3 - 1) + (0.6 - kLn06 - 1) + 0 + (0.25 - kLnQuarter - 1)) / 4));
  CHECK(m.count("rollout_corr/rollout_is_batch_norm_factor") == 0);
}

TEST_CASE("rollout correction, sequence level and batch normalisation",
          "[train][rollout_correction]") {
  SECTION("sequence: exp of each response's summed log-ratio, truncated") {
    auto corrected = ComputeRolloutCorrection(Old(), Rollout(), Mask(),
                                              {.sequence = true, .threshold = 2.0}, Alone);
    REQUIRE(corrected.ok());
    // Row 0: exp(ln 3 + ln 0.6) = 1.8 on each token; row 1: 0.25 on its one token.
    CHECK(at::allclose(corrected->weights, Rows({{1.8, 1.8, 1.8}, {0.25, 0, 0}}), 0, 1e-6));
    CHECK(corrected->metrics.at("rollout_corr/rollout_is_max") == Approx(1.8));
    CHECK(corrected->metrics.at("rollout_corr/rollout_is_min") == Approx(0.25));
    CHECK(corrected->metrics.at("rollout_corr/rollout_is_ratio_fraction_high") == Approx(0.0));
    CHECK(corrected->metrics.at("rollout_corr/rollout_is_ratio_fraction_low") == Approx(0.5));
  }
  SECTION("token, normalised to mean 1 over the batch's tokens") {
    auto corrected = ComputeRolloutCorrection(Old(), Rollout(), Mask(),
                                              {.threshold = 2.0, .batch_normalize = true}, Alone);
    REQUIRE(corrected.ok());
    const double mean = (2 + 0.6 + 1 + 0.25) / 4;
    CHECK(corrected->metrics.at("rollout_corr/rollout_is_batch_norm_factor") == Approx(mean));
    CHECK(at::allclose(corrected->weights, Rows({{2.0, 0.6, 1.0}, {0.25, 0, 0}}) / mean, 0, 1e-6));
  }
  SECTION("sequence, normalised over responses' mean weights") {
    const at::Tensor old = Rows({{kLn3, kLn3, 0.0}, {std::log(0.5), 0.0, 0.0}});
    auto corrected = ComputeRolloutCorrection(
        old, Rollout(), Mask(), {.sequence = true, .threshold = 4.0, .batch_normalize = true},
        Alone);
    REQUIRE(corrected.ok());
    // Row 0: exp(2 ln 3) = 9, truncated to 4; row 1: 0.5. Mean over responses 2.25.
    CHECK(at::allclose(corrected->weights, Rows({{4, 4, 4}, {0.5, 0, 0}}) / 2.25, 0, 1e-6));
    CHECK(corrected->metrics.at("rollout_corr/rollout_is_max") == Approx(9.0));
  }
}

TEST_CASE("rollout correction over two replicas: batch means and extremes span both",
          "[train][rollout_correction]") {
  // Each replica holds one row; the stand-in reduction adds (or takes the larger of) the other
  // row's figures, as ReduceOverReplicas would.
  const auto half = [](int row) {
    return std::make_tuple(Old().narrow(0, row, 1), Rollout().narrow(0, row, 1),
                           Mask().narrow(0, row, 1));
  };
  std::vector<std::vector<double>> sums(2), maxima(2);
  for (int row = 0; row < 2; ++row) {
    auto [old, rollout, mask] = half(row);
    REQUIRE(ComputeRolloutCorrection(old, rollout, mask, {.threshold = 2.0},
                                     [&](std::vector<double>& values, bool maximum) {
                                       (maximum ? maxima : sums)[row] = values;
                                       return absl::OkStatus();
                                     })
                .ok());
  }
  auto [old, rollout, mask] = half(0);
  auto combined = ComputeRolloutCorrection(
      old, rollout, mask, {.threshold = 2.0, .batch_normalize = true},
      [&](std::vector<double>& values, bool maximum) {
        const auto& other = (maximum ? maxima : sums)[1];
        for (size_t i = 0; i < values.size(); ++i) {
          values[i] = maximum ? std::max(values[i], other[i]) : values[i] + other[i];
        }
        return absl::OkStatus();
      });
  REQUIRE(combined.ok());
  const auto& m = combined->metrics;
  const double mean = (2 + 0.6 + 1 + 0.25) / 4;
  CHECK(m.at("rollout_corr/rollout_is_mean") == Approx(mean));
  CHECK(m.at("rollout_corr/rollout_is_min") == Approx(0.25));
  CHECK(m.at("rollout_corr/rollout_is_max") == Approx(2.0));
  // Normalised by the whole batch's mean, not this replica's.
  CHECK(at::allclose(combined->weights, Rows({{2.0, 0.6, 1.0}}) / mean, 0, 1e-6));
}

TEST_CASE("rollout probs diff: verl's training/rollout_probs_diff_* and pearson, by hand",
          "[train][rollout_correction]") {
  // Rollout probabilities 1 everywhere (log 0); the trainer's 3, 0.6, 1 and 0.25 on the four
  // response tokens: |diff| = 2, 0.4, 0, 0.75.
  auto metrics = RolloutProbsDiffMetrics(Old(), Rollout(), Mask(), Alone);
  REQUIRE(metrics.ok());
  const double mean = (2 + 0.4 + 0 + 0.75) / 4;
  const double variance = ((2 - mean) * (2 - mean) + (0.4 - mean) * (0.4 - mean) + mean * mean +
                           (0.75 - mean) * (0.75 - mean)) /
                          3;  // torch.std: unbiased
  CHECK(metrics->at("training/rollout_probs_diff_max") == Approx(2.0));
  CHECK(metrics->at("training/rollout_probs_diff_mean") == Approx(mean));
  CHECK(metrics->at("training/rollout_probs_diff_std") == Approx(std::sqrt(variance)));
  CHECK(metrics->at("training/rollout_probs_diff_valid") == 1);
  // The rollout's probabilities do not vary: no correlation to state.
  CHECK(metrics->count("training/rollout_actor_probs_pearson_corr") == 0);
  // Nothing to compare: no metrics rather than NaN.
  auto empty = RolloutProbsDiffMetrics(Old(), Rollout(), at::zeros({2, 3}), Alone);
  REQUIRE(empty.ok());
  CHECK(empty->empty());
}

TEST_CASE("rollout probs diff against torch's std and corrcoef, split over two replicas",
          "[train][rollout_correction]") {
  at::manual_seed(5);
  const at::Tensor old = -at::rand({6, 9}, at::kDouble) * 4;
  const at::Tensor rollout = old + at::randn({6, 9}, at::kDouble) * 0.3;
  const at::Tensor mask = (at::rand({6, 9}) > 0.3).to(at::kFloat);
  const at::Tensor keep = mask.to(at::kBool);
  const at::Tensor p_rollout = rollout.exp().masked_select(keep);
  const at::Tensor p_actor = old.exp().masked_select(keep);
  const at::Tensor diff = (p_rollout - p_actor).abs();
  const double pearson = at::corrcoef(at::stack({p_rollout, p_actor}))[0][1].item<double>();
  // Rows 0-2 on one replica, 3-5 on the other; the stand-in reduction adds the other's sums or
  // takes the larger maximum, as ReduceOverReplicas.
  std::vector<std::vector<double>> sums(2), maxima(2);
  const auto part = [&](const at::Tensor& t, int replica) { return t.narrow(0, 3 * replica, 3); };
  REQUIRE(RolloutProbsDiffMetrics(part(old, 1), part(rollout, 1), part(mask, 1),
                                  [&](std::vector<double>& values, bool maximum) {
                                    (maximum ? maxima : sums)[1] = values;
                                    return absl::OkStatus();
                                  })
              .ok());
  auto metrics = RolloutProbsDiffMetrics(part(old, 0), part(rollout, 0), part(mask, 0),
                                         [&](std::vector<double>& values, bool maximum) {
                                           const auto& other = (maximum ? maxima : sums)[1];
                                           for (size_t i = 0; i < values.size(); ++i) {
                                             values[i] = maximum ? std::max(values[i], other[i])
                                                                 : values[i] + other[i];
                                           }
                                           return absl::OkStatus();
                                         });
  REQUIRE(metrics.ok());
  CHECK(metrics->at("training/rollout_probs_diff_max") == Approx(diff.max().item<double>()));
  CHECK(metrics->at("training/rollout_probs_diff_mean") == Approx(diff.mean().item<double>()));
  CHECK(metrics->at("training/rollout_probs_diff_std") == Approx(diff.std().item<double>()));
  CHECK(metrics->at("training/rollout_actor_probs_pearson_corr") == Approx(pearson));
}

// The weights multiply each token's policy loss before it is aggregated, as verl's: weights of
// 0.5 halve the loss and its gradient; per-token weights weigh each token's term.
TEST_CASE("importance weights multiply the policy loss and its gradient",
          "[train][rollout_correction]") {
  const at::Tensor old = Rows({{0.0, -0.1, 0.2}, {0.1, 0.0, 0.0}}).to(at::kDouble);
  const at::Tensor advantages = Rows({{1.0, -2.0, 0.5}, {-1.0, 0, 0}}).to(at::kDouble);
  const at::Tensor mask = Mask().to(at::kDouble);
  const auto loss_and_gradient = [&](const at::Tensor& weights) {
    at::Tensor log_prob = Rows({{0.05, -0.05, 0.1}, {0.0, 0, 0}}).to(at::kDouble).requires_grad_();
    const PolicyLoss loss =
        ComputePolicyLoss(log_prob, old, advantages, mask, {}, std::nullopt, weights);
    loss.loss.backward();
    return std::make_pair(loss.loss.item<double>(), log_prob.grad());
  };
  const auto [plain, plain_gradient] = loss_and_gradient(at::Tensor());
  const auto [half, half_gradient] = loss_and_gradient(at::full({2, 3}, 0.5, at::kDouble));
  CHECK(half == Approx(plain / 2));
  CHECK(at::allclose(half_gradient, plain_gradient / 2));
  const at::Tensor per_token = Rows({{2.0, 0.0, 1.0}, {0.5, 0, 0}}).to(at::kDouble);
  const auto [weighted, weighted_gradient] = loss_and_gradient(per_token);
  CHECK(at::allclose(weighted_gradient, plain_gradient * per_token));
  CHECK(weighted != Approx(plain));
}

TEST_CASE("log-probs at a sampling temperature are those of log_softmax(logits / T)",
          "[train][rollout_correction]") {
  at::manual_seed(3);
  const at::Tensor hidden = at::randn({5, 8}, at::kFloat);
  const at::Tensor head = at::randn({11, 8}, at::kFloat);
  const at::Tensor targets = at::randint(0, 11, {5}, at::kLong);
  for (double temperature : {0.7, 1.0, 1.3}) {
    INFO("temperature " << temperature);
    auto [log_probs, entropy] =
        ChunkedLogProbs(TemperatureScaled(hidden, temperature), head, targets, /*chunk=*/2);
    const at::Tensor scaled = at::log_softmax(
        at::matmul(hidden.to(at::kDouble), head.to(at::kDouble).t()) / temperature, -1);
    const at::Tensor expected = scaled.gather(1, targets.unsqueeze(1)).squeeze(1);
    CHECK((log_probs.to(at::kDouble) - expected).abs().max().item<double>() < 1e-5);
    const at::Tensor expected_entropy = -(scaled.exp() * scaled).sum(1);
    CHECK((entropy.to(at::kDouble) - expected_entropy).abs().max().item<double>() < 1e-5);
  }
}

}  // namespace
}  // namespace rlhfd::train
