// Advantage estimators against hand-worked cases and an independent float64 reference written
// here with plain loops (no ATen), with masks, padding, groups whose rewards are all equal,
// single-response groups and length-1 responses; grpo_passk and opo against verl's own functions'
// float64 output.
#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <utility>
#include <vector>

#include "tests/unit/train/train_test_support.h"
#include "worker/train/advantage.h"

namespace rlhfd::train {
namespace {

using testing::CheckClose;
using testing::kMask;
using testing::Matrix;
using testing::ToMatrix;
using testing::ToTensor;

// The sequence reward sits on each response's last token; one token carries a shaping term.
const Matrix kRewards = {
    {0, 0, 0.3, 0, 1.0}, {0, 0, 0.0, 0, 0}, {0.5, 0, 0, 0, 0}, {0, 0, 0, 2, 0}};
const Matrix kValues = {
    {0.1, 0.2, 0.3, 0.4, 0.5}, {0.5, 0.4, 0.3, 9, 9}, {0.2, 9, 9, 9, 9}, {0.0, -0.1, 0.2, 0.1, 9}};

// float64 reference of masked whitening (unbiased variance).
Matrix RefWhiten(const Matrix& x, const Matrix& mask) {
  double n = 0, sum = 0;
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t j = 0; j < x[i].size(); ++j) n += mask[i][j], sum += x[i][j] * mask[i][j];
  const double mean = sum / n;
  double sq = 0;
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t j = 0; j < x[i].size(); ++j) sq += (x[i][j] - mean) * (x[i][j] - mean) * mask[i][j];
  const double scale = 1 / std::sqrt(sq / (n - 1) + 1e-8);
  Matrix out = x;
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t j = 0; j < x[i].size(); ++j) out[i][j] = (x[i][j] - mean) * scale * mask[i][j];
  return out;
}

std::vector<double> RefScores(const Matrix& rewards, const Matrix& mask) {
  std::vector<double> scores;
  for (size_t i = 0; i < rewards.size(); ++i) {
    double s = 0;
    for (size_t j = 0; j < rewards[i].size(); ++j) s += rewards[i][j] * mask[i][j];
    scores.push_back(s);
  }
  return scores;
}

Matrix Broadcast(const std::vector<double>& per_sequence, const Matrix& mask) {
  Matrix out = mask;
  for (size_t i = 0; i < mask.size(); ++i)
    for (size_t j = 0; j < mask[i].size(); ++j) out[i][j] = per_sequence[i] * mask[i][j];
  return out;
}

AdvantageOutput Run(v1::AdvantageEstimator estimator, AdvantageInput input) {
  auto made = MakeAdvantageEstimator(estimator);
  REQUIRE(made.ok());
  auto out = (*made)->Compute(input);
  REQUIRE(out.ok());
  return *out;
}

AdvantageInput Input(const std::vector<int64_t>& groups) {
  AdvantageInput input;
  input.token_rewards = ToTensor(kRewards);
  input.mask = ToTensor(kMask);
  input.values = ToTensor(kValues);
  input.group = at::tensor(groups, at::kLong);
  return input;
}

TEST_CASE("GAE: hand-worked case and float64 reference with padding", "[train][advantage]") {
  // Hand-worked, T = 2, γ = λ = 1: r = [0, 1], V = [0.5, 0.2]. δ1 = 1 - 0.2 = 0.8, A1 = 0.8;
  // δ0 = 0 + 0.2 - 0.5 = -0.3, A0 = -0.3 + 0.8 = 0.5; returns = A + V = [1.0, 1.0].
  AdvantageInput tiny;
  tiny.token_rewards = ToTensor({{0, 1}});
  tiny.values = ToTensor({{0.5, 0.2}});
  tiny.mask = ToTensor({{1, 1}});
  CheckClose(ToMatrix(Run(v1::ADVANTAGE_ESTIMATOR_GAE, tiny).returns), {{1.0, 1.0}}, 1e-12);

  for (const auto& [gamma, lam] : {std::pair{1.0, 1.0}, std::pair{0.99, 0.95}}) {
    AdvantageInput input = Input({0, 0, 1, 1});
    input.gamma = gamma;
    input.lam = lam;
    AdvantageOutput out = Run(v1::ADVANTAGE_ESTIMATOR_GAE, input);
    // Reference: backwards over each sequence's real tokens only.
    Matrix advantages = kMask, returns = kMask;
    for (size_t i = 0; i < kMask.size(); ++i) {
      double next_value = 0, gae = 0;
      for (int t = static_cast<int>(kMask[i].size()) - 1; t >= 0; --t) {
        if (kMask[i][t] == 0) {
          advantages[i][t] = gae;  // Padding carries nothing (gae is 0 until the sequence ends).
          continue;
        }
        const double delta = kRewards[i][t] + gamma * next_value - kValues[i][t];
        gae = delta + gamma * lam * gae;
        next_value = kValues[i][t];
        advantages[i][t] = gae;
        returns[i][t] = gae + kValues[i][t];
      }
    }
    Matrix actual_returns = ToMatrix(out.returns * input.mask);
    Matrix expected_returns = returns;
    for (size_t i = 0; i < kMask.size(); ++i)
      for (size_t j = 0; j < kMask[i].size(); ++j) expected_returns[i][j] *= kMask[i][j];
    CheckClose(actual_returns, expected_returns, 1e-12);
    CheckClose(ToMatrix(out.advantages), RefWhiten(advantages, kMask), 1e-9);
  }
  AdvantageInput no_values = Input({0, 0, 1, 1});
  no_values.values = at::Tensor();
  auto estimator = MakeAdvantageEstimator(v1::ADVANTAGE_ESTIMATOR_GAE);
  CHECK_FALSE((*estimator)->Compute(no_values).ok());
}

TEST_CASE("GRPO: group mean and std, equal rewards, single responses", "[train][advantage]") {
  // Hand-worked: scores 1.3 and 0 in group 0 → mean 0.65, std sqrt(0.845) = 0.919239;
  // advantages ±0.65 / (0.919239 + 1e-6).
  AdvantageOutput out = Run(v1::ADVANTAGE_ESTIMATOR_GRPO, Input({0, 0, 1, 1}));
  const double a = 0.65 / (std::sqrt(0.845) + 1e-6);
  CHECK(ToMatrix(out.advantages)[0][0] == Approx(a).epsilon(1e-12));
  CHECK(ToMatrix(out.advantages)[1][2] == Approx(-a).epsilon(1e-12));
  CHECK(ToMatrix(out.advantages)[1][3] == 0.0);  // Padding.

  // float64 reference for all four, with and without std normalisation.
  for (bool norm : {true, false}) {
    AdvantageInput input = Input({0, 0, 1, 1});
    input.norm_adv_by_std = norm;
    const std::vector<double> s = RefScores(kRewards, kMask);
    std::vector<double> expected(4);
    for (int g = 0; g < 2; ++g) {
      const double x = s[2 * g], y = s[2 * g + 1], mean = (x + y) / 2;
      const double std = std::sqrt(((x - mean) * (x - mean) + (y - mean) * (y - mean)) / 1);
      expected[2 * g] = norm ? (x - mean) / (std + 1e-6) : x - mean;
      expected[2 * g + 1] = norm ? (y - mean) / (std + 1e-6) : y - mean;
    }
    CheckClose(ToMatrix(Run(v1::ADVANTAGE_ESTIMATOR_GRPO, input).advantages),
               Broadcast(expected, kMask), 1e-12);
  }

  // All-equal rewards in a group (std 0) give zero advantages, not NaN; a group of one gets its
  // raw score (mean 0, std 1).
  AdvantageInput equal = Input({0, 0, 1, 2});
  equal.token_rewards =
      ToTensor({{0, 0, 0, 0, 1}, {0, 0, 1, 0, 0}, {0.5, 0, 0, 0, 0}, {0, 0, 0, 2, 0}});
  Matrix advantages = ToMatrix(Run(v1::ADVANTAGE_ESTIMATOR_GRPO, equal).advantages);
  CHECK(advantages[0][0] == 0.0);
  CHECK(advantages[1][0] == 0.0);
  CHECK(advantages[2][0] == Approx(0.5 / (1 + 1e-6)));
  CHECK(advantages[3][0] == Approx(2.0 / (1 + 1e-6)));
}

TEST_CASE("RLOO: leave-one-out baseline", "[train][advantage]") {
  // Hand-worked: scores [1, 0, 0] in one group: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5.
  AdvantageInput input;
  input.token_rewards = ToTensor({{1}, {0}, {0}});
  input.mask = ToTensor({{1}, {1}, {1}});
  input.group = at::tensor(std::vector<int64_t>{0, 0, 0}, at::kLong);
  CheckClose(ToMatrix(Run(v1::ADVANTAGE_ESTIMATOR_RLOO, input).advantages), {{1}, {-0.5}, {-0.5}},
             1e-12);
  // float64 reference on the padded batch; group 1 = responses 2, 3; response 3 alone in 2.
  AdvantageInput padded = Input({0, 0, 1, 2});
  const std::vector<double> s = RefScores(kRewards, kMask);
  const std::vector<double> expected = {s[0] - s[1], s[1] - s[0], s[2], s[3]};
  CheckClose(ToMatrix(Run(v1::ADVANTAGE_ESTIMATOR_RLOO, padded).advantages),
             Broadcast(expected, kMask), 1e-12);
}

TEST_CASE("REINFORCE++, its baseline variant and ReMax", "[train][advantage]") {
  const double gamma = 0.9;
  AdvantageInput input = Input({0, 0, 1, 1});
  input.gamma = gamma;
  Matrix returns = kMask;
  for (size_t i = 0; i < kMask.size(); ++i) {
    double running = 0;
    for (int t = static_cast<int>(kMask[i].size()) - 1; t >= 0; --t) {
      running = kRewards[i][t] * kMask[i][t] + gamma * running * kMask[i][t];
      returns[i][t] = running * kMask[i][t];
    }
  }
  AdvantageOutput plus = Run(v1::ADVANTAGE_ESTIMATOR_REINFORCE_PLUS_PLUS, input);
  CheckClose(ToMatrix(plus.returns * input.mask), returns, 1e-12);
  CheckClose(ToMatrix(plus.advantages), RefWhiten(returns, kMask), 1e-9);

  const std::vector<double> s = RefScores(kRewards, kMask);
  const std::vector<double> centered = {s[0] - (s[0] + s[1]) / 2, s[1] - (s[0] + s[1]) / 2,
                                        s[2] - (s[2] + s[3]) / 2, s[3] - (s[2] + s[3]) / 2};
  CheckClose(ToMatrix(Run(v1::ADVANTAGE_ESTIMATOR_REINFORCE_PLUS_PLUS_BASELINE, input).advantages),
             RefWhiten(Broadcast(centered, kMask), kMask), 1e-9);

  AdvantageInput remax = Input({0, 0, 1, 1});
  remax.baseline = at::tensor(std::vector<double>{0.5, 0.5, 0.2, 1.0}, at::kDouble);
  Matrix expected = kMask;
  for (size_t i = 0; i < kMask.size(); ++i) {
    double running = 0;
    for (int t = static_cast<int>(kMask[i].size()) - 1; t >= 0; --t) {
      running += kRewards[i][t] * kMask[i][t];
      expected[i][t] = (running - remax.baseline[i].item<double>()) * kMask[i][t];
    }
  }
  CheckClose(ToMatrix(Run(v1::ADVANTAGE_ESTIMATOR_REMAX, remax).advantages), expected, 1e-12);

  // A multi-turn response: a tool's turn (mask 0) between two of the model's. ReMax's return is
  // verl's reward-to-go over the sampled tokens, which reaches the turn before the tool's;
  // REINFORCE++'s, as verl's, restarts after a masked token, so the first turn gets none.
  AdvantageInput turns;
  turns.token_rewards = ToTensor({{0, 0, 1, 0}});
  turns.mask = ToTensor({{1, 0, 1, 0}});
  turns.baseline = at::tensor(std::vector<double>{0.25}, at::kDouble);
  turns.group = at::tensor(std::vector<int64_t>{0}, at::kLong);
  turns.gamma = gamma;
  CheckClose(ToMatrix(Run(v1::ADVANTAGE_ESTIMATOR_REMAX, turns).advantages), {{0.75, 0, 0.75, 0}},
             1e-12);
  CheckClose(ToMatrix(Run(v1::ADVANTAGE_ESTIMATOR_REINFORCE_PLUS_PLUS, turns).returns * turns.mask),
             {{0, 0, 1, 0}}, 1e-12);
  CHECK_FALSE(MakeAdvantageEstimator(v1::ADVANTAGE_ESTIMATOR_UNSPECIFIED).ok());
}

// Eight responses right-padded to T = 4 (lengths 4, 2, 3, 1, 4, 4, 2, 3) to three prompts; group
// 1's best score is tied. The expected advantages below are verl's own functions' output on this
// batch in float64: tests/fixtures/advantages/verl_outcome_advantages.py prints them.
const Matrix kPasskMask = {{1, 1, 1, 1}, {1, 1, 0, 0}, {1, 1, 1, 0}, {1, 0, 0, 0},
                           {1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 0, 0}, {1, 1, 1, 0}};
const Matrix kPasskRewards = {{0, 0, 0, 1.0}, {0, 0.25, 0, 0},  {0, 0, 0.5, 0}, {0.1, 0, 0, 0},
                              {0, 0, 0, 0.7}, {0, 0.2, 0, 0.5}, {0, 0.3, 0, 0}, {0, 0, -0.4, 0}};
const std::vector<int64_t> kPasskGroups = {0, 0, 0, 1, 1, 1, 2, 2};

AdvantageInput PasskInput() {
  AdvantageInput input;
  input.token_rewards = ToTensor(kPasskRewards);
  input.mask = ToTensor(kPasskMask);
  input.group = at::tensor(kPasskGroups, at::kLong);
  return input;
}

TEST_CASE("GRPO pass@k: verl's float64 advantages, ties and std normalisation",
          "[train][advantage]") {
  // Group 0: best 1.0 beats 0.5 by 0.5; group 1 ties at 0.7 (0 for all); group 2: 0.3 - (-0.4).
  const Matrix verl_normalized = {
      {1.3093039128535038, 1.3093039128535038, 1.3093039128535038, 1.3093039128535038},
      {0.0, 0.0, 0.0, 0.0},
      {0.0, 0.0, 0.0, 0.0},
      {0.0, 0.0, 0.0, 0.0},
      {0.0, 0.0, 0.0, 0.0},
      {0.0, 0.0, 0.0, 0.0},
      {1.4142107052360102, 1.4142107052360102, 0.0, 0.0},
      {0.0, 0.0, 0.0, 0.0}};
  const Matrix verl_raw = {{0.5, 0.5, 0.5, 0.5}, {0.0, 0.0, 0.0, 0.0}, {0.0, 0.0, 0.0, 0.0},
                           {0.0, 0.0, 0.0, 0.0}, {0.0, 0.0, 0.0, 0.0}, {0.0, 0.0, 0.0, 0.0},
                           {0.7, 0.7, 0.0, 0.0}, {0.0, 0.0, 0.0, 0.0}};
  for (const auto& [norm, expected] :
       {std::pair{true, verl_normalized}, std::pair{false, verl_raw}}) {
    INFO("norm_adv_by_std " << norm);
    AdvantageInput input = PasskInput();
    input.norm_adv_by_std = norm;
    const AdvantageOutput out = Run(v1::ADVANTAGE_ESTIMATOR_GRPO_PASSK, input);
    CheckClose(ToMatrix(out.advantages), expected, 1e-12);
    CheckClose(ToMatrix(out.returns), expected, 1e-12);
  }
  // verl refuses a group of one (no runner-up); so does rlhfd, naming rollout.n.
  AdvantageInput single = PasskInput();
  single.group = at::tensor(std::vector<int64_t>{0, 0, 0, 1, 1, 1, 2, 3}, at::kLong);
  auto estimator = MakeAdvantageEstimator(v1::ADVANTAGE_ESTIMATOR_GRPO_PASSK);
  const auto refused = (*estimator)->Compute(single);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("rollout.n"));
}

TEST_CASE("OPO: verl's float64 advantages with its length-weighted baseline",
          "[train][advantage]") {
  const Matrix verl = {
      {0.33333333333333337, 0.33333333333333337, 0.33333333333333337, 0.33333333333333337},
      {-0.41666666666666663, -0.41666666666666663, -0.0, -0.0},
      {-0.16666666666666663, -0.16666666666666663, -0.16666666666666663, -0.0},
      {-0.5333333333333333, -0.0, -0.0, -0.0},
      {0.06666666666666665, 0.06666666666666665, 0.06666666666666665, 0.06666666666666665},
      {0.06666666666666665, 0.06666666666666665, 0.06666666666666665, 0.06666666666666665},
      {0.42000000000000004, 0.42000000000000004, 0.0, 0.0},
      {-0.27999999999999997, -0.27999999999999997, -0.27999999999999997, -0.0}};
  const AdvantageOutput out = Run(v1::ADVANTAGE_ESTIMATOR_OPO, PasskInput());
  CheckClose(ToMatrix(out.advantages), verl, 1e-12);
  CheckClose(ToMatrix(out.returns), verl, 1e-12);
  // A response alone in its group keeps its score (verl's baseline 0 there).
  AdvantageInput single = PasskInput();
  single.group = at::tensor(std::vector<int64_t>{0, 0, 0, 1, 1, 1, 2, 3}, at::kLong);
  CHECK(ToMatrix(Run(v1::ADVANTAGE_ESTIMATOR_OPO, single).advantages)[7][0] ==
        Approx(-0.4).epsilon(1e-12));
}

}  // namespace
}  // namespace rlhfd::train
