// Losses, KL estimators, aggregation modes and advantage estimators against hand-worked cases and
// an independent float64 reference written here with plain loops (no ATen), with masks, padding,
// groups whose rewards are all equal, single-response groups and length-1 responses. Then the
// policy-loss path through a tiny transformer: finite-difference gradients in float64, and the
// direction of one update.
#include <ATen/ATen.h>
#include <torch/optim/adamw.h>
#include <torch/types.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "worker/model/model_loader.h"
#include "worker/train/advantage.h"
#include "worker/train/batching.h"
#include "worker/train/chunked_log_probs.h"
#include "worker/train/critic_update.h"
#include "worker/train/finite_check.h"
#include "worker/train/flops_estimate.h"
#include "worker/train/log_probs.h"
#include "worker/train/losses.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/optimizer.h"
#include "worker/train/policy_update.h"

namespace rlhfd::train {
namespace {

using Matrix = std::vector<std::vector<double>>;

// A fixture model (tests/fixtures/models/NAME) in float64 on the CPU, fresh on every call.
model::Transformer LoadFloat64Fixture(const std::string& name) {
  auto loaded = model::LoadModel(std::string(RLHFD_FIXTURES_DIR) + "/models/" + name,
                                 {at::kDouble, at::kCPU});
  REQUIRE(loaded.ok());
  return *loaded;
}

at::Tensor ToTensor(const Matrix& m) {
  at::Tensor t =
      at::zeros({static_cast<int64_t>(m.size()), static_cast<int64_t>(m[0].size())}, at::kDouble);
  for (size_t i = 0; i < m.size(); ++i) {
    for (size_t j = 0; j < m[i].size(); ++j) t[i][j] = m[i][j];
  }
  return t;
}

Matrix ToMatrix(const at::Tensor& t) {
  at::Tensor c = t.to(at::kDouble).contiguous();
  Matrix m(c.size(0), std::vector<double>(c.size(1)));
  for (int64_t i = 0; i < c.size(0); ++i) {
    for (int64_t j = 0; j < c.size(1); ++j) m[i][j] = c[i][j].item<double>();
  }
  return m;
}

void CheckClose(const Matrix& actual, const Matrix& expected, double tolerance) {
  REQUIRE(actual.size() == expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    for (size_t j = 0; j < actual[i].size(); ++j) {
      INFO("[" << i << "][" << j << "] " << actual[i][j] << " vs " << expected[i][j]);
      CHECK(std::abs(actual[i][j] - expected[i][j]) <= tolerance);
    }
  }
}

// Four responses, right-padded to T = 5, lengths 5, 3, 1 (a length-1 response) and 4.
const Matrix kMask = {{1, 1, 1, 1, 1}, {1, 1, 1, 0, 0}, {1, 0, 0, 0, 0}, {1, 1, 1, 1, 0}};
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

}  // namespace

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
  CHECK_FALSE(MakeAdvantageEstimator(v1::ADVANTAGE_ESTIMATOR_UNSPECIFIED).ok());
}

namespace {

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

}  // namespace

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

TEST_CASE("PPO policy loss: clip, clip-higher and dual clip, hand-worked", "[train][loss]") {
  PolicyLossOptions options;
  options.clip_ratio_low = 0.2;
  options.clip_ratio_high = 0.28;
  options.clip_ratio_c = 3.0;
  auto one = [&](double log_prob, double advantage) {
    return ComputePolicyLoss(ToTensor({{log_prob}}), ToTensor({{0.0}}), ToTensor({{advantage}}),
                             ToTensor({{1.0}}), options);
  };
  // A = 1, ratio 1.5: clipped at 1 + 0.28 → loss = max(-1.5, -1.28) = -1.28, clip active.
  PolicyLoss up = one(std::log(1.5), 1.0);
  CHECK(up.loss.item<double>() == Approx(-1.28));
  CHECK(up.clip_fraction.item<double>() == 1.0);
  // A = 1, ratio 0.5: max(-0.5, -0.8) = -0.5, no clip.
  CHECK(one(std::log(0.5), 1.0).loss.item<double>() == Approx(-0.5));
  // A = -1, ratio 4: PPO gives max(4, 1.28) = 4; the dual clip caps it at -A·c = 3.
  PolicyLoss dual = one(std::log(4.0), -1.0);
  CHECK(dual.loss.item<double>() == Approx(3.0));
  CHECK(dual.clip_fraction_low.item<double>() == 1.0);
  // A = -1, ratio 0.5: max(0.5, 0.8) = 0.8 (clip at 1 - 0.2).
  CHECK(one(std::log(0.5), -1.0).loss.item<double>() == Approx(0.8));
  // approx_kl = mean(old - new).
  CHECK(up.approx_kl.item<double>() == Approx(-std::log(1.5)));
}

TEST_CASE("PPO policy loss against a float64 reference on a padded batch", "[train][loss]") {
  const Matrix log_prob = {{-1.0, -0.5, -2.0, -0.1, -3.0},
                           {-0.2, -0.9, -1.1, 0, 0},
                           {-0.05, 0, 0, 0, 0},
                           {-1.5, -1.2, -0.3, -0.7, 0}};
  const Matrix old = {{-1.2, -0.4, -1.0, -0.1, -3.5},
                      {-0.1, -1.4, -1.0, 0, 0},
                      {-1.0, 0, 0, 0, 0},
                      {-1.4, -1.3, -0.9, -0.2, 0}};
  const Matrix advantages = {{1.0, -0.5, 2.0, -1.5, 0.3},
                             {-2.0, 0.7, 0.1, 5, 5},
                             {-1.0, 5, 5, 5, 5},
                             {0.4, -0.8, 1.2, -0.3, 5}};
  const double low = 0.2, high = 0.28, c = 3.0;
  Matrix per_token = kMask;
  for (size_t i = 0; i < kMask.size(); ++i) {
    for (size_t j = 0; j < kMask[i].size(); ++j) {
      const double ratio = std::exp(log_prob[i][j] - old[i][j]);
      const double a = advantages[i][j];
      double loss = std::max(-a * ratio, -a * std::min(std::max(ratio, 1 - low), 1 + high));
      if (a < 0) loss = std::min(loss, -a * c);
      per_token[i][j] = loss;
    }
  }
  const std::map<v1::LossAggregation, double> expected = [&] {
    double sum = 0, tokens = 0, seq_sum = 0, seq_mean = 0;
    for (size_t i = 0; i < kMask.size(); ++i) {
      double s = 0, n = 0;
      for (size_t j = 0; j < kMask[i].size(); ++j)
        s += per_token[i][j] * kMask[i][j], n += kMask[i][j];
      sum += s, tokens += n, seq_sum += s / kMask.size(), seq_mean += s / n / kMask.size();
    }
    return std::map<v1::LossAggregation, double>{
        {v1::LOSS_AGGREGATION_TOKEN_MEAN, sum / tokens},
        {v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM, seq_sum},
        {v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN, seq_mean},
        // verl >= 0.9 (PR #4510, Dr. GRPO): non-empty sequences x T.
        {v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM_NORM, sum / (kMask.size() * 5.0)}};
  }();
  for (const auto& [mode, value] : expected) {
    INFO(v1::LossAggregation_Name(mode));
    PolicyLossOptions options{low, high, c, mode};
    PolicyLoss loss = ComputePolicyLoss(ToTensor(log_prob), ToTensor(old), ToTensor(advantages),
                                        ToTensor(kMask), options);
    CHECK(loss.loss.item<double>() == Approx(value).epsilon(1e-12));
  }
}

TEST_CASE("value loss with value clipping, hand-worked", "[train][loss]") {
  // v = 1.0, old = 0.2, R = 1.2, cliprange 0.5: unclipped (1 - 1.2)² = 0.04; clipped v = 0.7,
  // (0.7 - 1.2)² = 0.25; loss = 0.5 · max = 0.125, clip active. Second token: v = 0.3, old 0.2,
  // R = 0: 0.09 vs 0.09 → 0.045, not counted as clipped. Token mean: (0.125 + 0.045) / 2.
  ValueLoss loss = ComputeValueLoss(ToTensor({{1.0, 0.3, 7}}), ToTensor({{0.2, 0.2, 7}}),
                                    ToTensor({{1.2, 0.0, 0}}), ToTensor({{1, 1, 0}}), 0.5,
                                    v1::LOSS_AGGREGATION_TOKEN_MEAN);
  CHECK(loss.loss.item<double>() == Approx((0.125 + 0.045) / 2));
  CHECK(loss.clip_fraction.item<double>() == Approx(0.5));
}

TEST_CASE("KL estimators k1, k2, k3", "[train][kl]") {
  // p = 1, ref = 0.5 (log-probs 0 and log 0.5): k1 = log 2; k2 = ½ log² 2; k3 = 0.5 + log 0.5·(-1)
  // - 1.
  const at::Tensor lp = ToTensor({{0.0}}), ref = ToTensor({{std::log(0.5)}});
  CHECK(KlEstimate(lp, ref, v1::KL_ESTIMATOR_K1).item<double>() == Approx(std::log(2.0)));
  CHECK(KlEstimate(lp, ref, v1::KL_ESTIMATOR_K2).item<double>() ==
        Approx(0.5 * std::log(2.0) * std::log(2.0)));
  CHECK(KlEstimate(lp, ref, v1::KL_ESTIMATOR_K3).item<double>() == Approx(0.5 + std::log(2.0) - 1));
  // k3 is clamped: a log-ratio of 50 saturates at 20 before exp, and the result at 10.
  CHECK(KlEstimate(ToTensor({{-50.0}}), ToTensor({{0.0}}), v1::KL_ESTIMATOR_K3).item<double>() ==
        10.0);
  // k3 is never negative and is 0 where the policies agree.
  CHECK(KlEstimate(ref, ref, v1::KL_ESTIMATOR_K3).item<double>() == 0.0);
}

TEST_CASE("the policy-loss path through a tiny transformer", "[train][gradient]") {
  auto loaded = model::LoadModel(std::string(RLHFD_FIXTURES_DIR) + "/models/tiny-qwen2",
                                 {at::kDouble, at::kCPU});
  REQUIRE(loaded.ok());
  model::Transformer net = *loaded;
  at::manual_seed(3);
  const at::Tensor ids = at::randint(3, 500, {2, 6}, at::kLong);
  const at::Tensor mask = at::ones({2, 5}, at::kDouble);
  const at::Tensor targets = ids.narrow(1, 1, 5);
  auto token_log_probs = [&] {
    at::Tensor logits = net->Logits(net->Hidden({ids})).narrow(1, 0, 5);  // (2, 5, V)
    return TokenLogProbs(logits, targets);                                // (2, 5)
  };
  at::Tensor old;
  {
    torch::NoGradGuard no_grad;
    old = token_log_probs() - 0.05;  // A slightly different behaviour policy.
  }
  const at::Tensor advantages =
      ToTensor({{1.0, -0.5, 0.3, -1.0, 0.8}, {-0.2, 0.6, -1.2, 0.4, 1.0}});
  PolicyLossOptions options{0.2, 0.28, 3.0, v1::LOSS_AGGREGATION_TOKEN_MEAN};
  auto loss_value = [&] {
    return ComputePolicyLoss(token_log_probs(), old, advantages, mask, options).loss;
  };

  SECTION("finite-difference gradients match autograd in float64") {
    at::Tensor loss = loss_value();
    loss.backward();
    auto params = net->named_parameters();
    for (const std::string name :
         {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight",
          "model.norm.weight", "model.embed_tokens.weight"}) {
      at::Tensor p = params[name];
      at::Tensor grad = p.grad().clone();
      const double eps = 1e-6;
      for (int64_t k : {0, 7, 31}) {
        torch::NoGradGuard no_grad;
        at::Tensor flat = p.view({-1});
        const int64_t index = (k * 997) % flat.numel();
        const double saved = flat[index].item<double>();
        flat[index] = saved + eps;
        const double plus = loss_value().item<double>();
        flat[index] = saved - eps;
        const double minus = loss_value().item<double>();
        flat[index] = saved;
        const double numeric = (plus - minus) / (2 * eps);
        const double analytic = grad.view({-1})[index].item<double>();
        INFO(name << "[" << index << "] numeric " << numeric << " autograd " << analytic);
        CHECK(std::abs(numeric - analytic) <= 1e-6 + 1e-5 * std::abs(analytic));
      }
    }
  }

  SECTION("one update raises log-probs where A > 0, lowers them where A < 0, and flips with A") {
    for (const double sign : {1.0, -1.0}) {
      auto fresh = model::LoadModel(std::string(RLHFD_FIXTURES_DIR) + "/models/tiny-qwen2",
                                    {at::kDouble, at::kCPU});
      REQUIRE(fresh.ok());
      net = *fresh;
      at::Tensor before;
      {
        torch::NoGradGuard no_grad;
        before = token_log_probs();
      }
      const at::Tensor signed_advantages =
          sign * ToTensor({{1.0, -1.0, 1.0, -1.0, 1.0}, {-1.0, 1.0, -1.0, 1.0, -1.0}});
      ComputePolicyLoss(token_log_probs(), before, signed_advantages, mask, options)
          .loss.backward();
      {
        torch::NoGradGuard no_grad;
        for (auto& p : net->parameters()) p.sub_(1e-3 * p.grad());
      }
      at::Tensor delta;
      {
        torch::NoGradGuard no_grad;
        delta = token_log_probs() - before;
      }
      // Summed over the tokens of each sign, the update moves log-probs the advantage's way.
      const double up = (delta * signed_advantages.gt(0)).sum().item<double>();
      const double down = (delta * signed_advantages.lt(0)).sum().item<double>();
      INFO("sign " << sign << ": positive-A tokens " << up << ", negative-A tokens " << down);
      CHECK(up > 0);
      CHECK(down < 0);
    }
  }
}

TEST_CASE("learning-rate schedules: warm-up, constant, cosine, linear", "[train][lr]") {
  v1::TrainSpec train;
  train.set_lr(1e-3);
  train.set_lr_warmup_steps(10);
  train.set_min_lr_ratio(0.1);
  train.set_lr_schedule(v1::LR_SCHEDULE_CONSTANT);
  LrSchedule constant(train, 110);
  CHECK(constant.At(0) == 0.0);
  CHECK(constant.At(5) == Approx(5e-4));
  CHECK(constant.At(10) == Approx(1e-3));
  CHECK(constant.At(109) == Approx(1e-3));
  train.set_lr_schedule(v1::LR_SCHEDULE_COSINE);
  LrSchedule cosine(train, 110);
  // Halfway through the 100 decay steps: 0.1 + 0.9 · ½(1 + cos(π/2)) = 0.55 of the peak.
  CHECK(cosine.At(60) == Approx(0.55e-3));
  CHECK(cosine.At(110) == Approx(1e-4));
  CHECK(cosine.At(500) == Approx(1e-4));  // Past the end stays at the floor.
  train.set_lr_schedule(v1::LR_SCHEDULE_LINEAR);
  LrSchedule linear(train, 110);
  CHECK(linear.At(35) == Approx(1e-3 * (0.1 + 0.9 * 0.75)));
}

TEST_CASE("fused AdamW matches LibTorch's own AdamW; clipping bounds the global norm",
          "[train][optimizer]") {
  at::manual_seed(5);
  std::vector<at::Tensor> ours, reference;
  for (auto shape :
       {std::vector<int64_t>{7, 3}, std::vector<int64_t>{11}, std::vector<int64_t>{2, 2, 2}}) {
    at::Tensor init = at::randn(shape);
    ours.push_back(init.clone().set_requires_grad(true));
    reference.push_back(init.clone().set_requires_grad(true));
  }
  AdamW optimizer(ours, {0.9, 0.95, 1e-8, 0.1});
  torch::optim::AdamW libtorch(
      reference, torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < ours.size(); ++i) {
      at::Tensor grad = at::randn(ours[i].sizes());
      ours[i].mutable_grad() = grad.clone();
      reference[i].mutable_grad() = grad.clone();
    }
    optimizer.Step(1e-2);
    libtorch.step();
  }
  for (size_t i = 0; i < ours.size(); ++i) {
    CHECK((ours[i] - reference[i]).abs().max().item<double>() <= 1e-6);
  }

  // Global norm of gradients (3, 4) and (12): sqrt(9 + 16 + 144) = 13; clipped to 6.5.
  ours[0].mutable_grad() = at::zeros({7, 3});
  ours[0].mutable_grad()[0][0] = 3.0;
  ours[0].mutable_grad()[1][0] = 4.0;
  ours[1].mutable_grad() = at::zeros({11});
  ours[1].mutable_grad()[0] = 12.0;
  ours[2].mutable_grad().reset();
  CHECK(optimizer.ClipGradNorm(6.5) == Approx(13.0));
  CHECK(optimizer.ClipGradNorm(0.0) == Approx(6.5).epsilon(1e-5));
  optimizer.ZeroGrad();
  CHECK_FALSE(ours[0].grad().defined());
}

TEST_CASE("chunked log-probs and entropy equal the full-logits computation, values and gradients",
          "[train][log_probs]") {
  at::manual_seed(13);
  for (const at::ScalarType dtype : {at::kDouble, at::kFloat}) {
    const double tolerance = dtype == at::kDouble ? 1e-10 : 2e-5;
    const at::Tensor hidden0 = at::randn({37, 8}, dtype);
    const at::Tensor weight0 = at::randn({50, 8}, dtype);
    const at::Tensor targets = at::randint(0, 50, {37}, at::kLong);
    const at::Tensor a = at::randn({37}, dtype), b = at::randn({37}, dtype);

    at::Tensor hidden = hidden0.clone().set_requires_grad(true);
    at::Tensor weight = weight0.clone().set_requires_grad(true);
    at::Tensor logits = at::mm(hidden, weight.t()).unsqueeze(0);  // (1, N, V)
    at::Tensor lp = TokenLogProbs(logits, targets.unsqueeze(0)).squeeze(0);
    at::Tensor entropy = TokenEntropy(logits).squeeze(0);
    ((a * lp).sum() + (b * entropy).sum()).backward();

    for (const int64_t chunk : {5, 64}) {
      INFO("dtype " << dtype << ", chunk " << chunk);
      at::Tensor h = hidden0.clone().set_requires_grad(true);
      at::Tensor w = weight0.clone().set_requires_grad(true);
      auto [chunked_lp, chunked_entropy] = ChunkedLogProbs(h, w, targets, chunk);
      ((a * chunked_lp).sum() + (b * chunked_entropy).sum()).backward();
      CHECK((chunked_lp - lp).abs().max().item<double>() <= tolerance);
      CHECK((chunked_entropy - entropy).abs().max().item<double>() <= tolerance);
      CHECK((h.grad() - hidden.grad()).abs().max().item<double>() <= tolerance);
      CHECK((w.grad() - weight.grad()).abs().max().item<double>() <= tolerance);
    }
  }
}

TEST_CASE("policy update: accumulation, token budgets, packing and checkpointing change nothing",
          "[train][update]") {
  auto load = [] { return LoadFloat64Fixture("tiny-qwen2"); };
  at::manual_seed(21);
  const int64_t b = 4, t = 8;
  const std::vector<int64_t> lengths = {8, 6, 8, 5};  // Right-padded rows of different lengths.
  PolicyUpdateBatch batch;
  batch.input_ids = at::randint(3, 500, {b, t}, at::kLong);
  batch.attention_mask = at::zeros({b, t}, at::kLong);
  batch.response_mask = at::zeros({b, t - 1}, at::kDouble);
  for (int64_t i = 0; i < b; ++i) {
    batch.attention_mask[i].narrow(0, 0, lengths[i]).fill_(1);
    batch.response_mask[i].narrow(0, 3, lengths[i] - 4).fill_(1);  // Response after 4 tokens.
  }
  batch.advantages = at::randn({b, t - 1}, at::kDouble) * batch.response_mask;
  {
    model::Transformer reference = load();
    torch::NoGradGuard no_grad;
    at::Tensor logits =
        reference->Logits(reference->Hidden({batch.input_ids, batch.attention_mask}))
            .narrow(1, 0, t - 1);
    batch.old_log_probs = TokenLogProbs(logits, batch.input_ids.narrow(1, 1, t - 1)) - 0.02;
  }
  batch.ref_log_probs = batch.old_log_probs + 0.01;

  PolicyUpdateOptions options;
  options.loop.mini_batch = 4;
  options.entropy_coeff = 0.01;
  options.kl_coef = 0.1;
  options.loop.lr = 1e-3;
  auto run = [&](MicroBatching micro) {
    model::Transformer net = load();
    LocalModel trained(net, {});
    PolicyUpdateOptions o = options;
    o.loop.micro = micro;
    auto metrics = UpdatePolicy(trained, batch, o);
    REQUIRE(metrics.ok());
    return std::make_pair(net, *metrics);
  };
  auto [whole, whole_metrics] = run({.micro_batch = 4});
  const auto largest_difference = [&](model::Transformer& other) {
    double worst = 0;
    auto a = whole->parameters(), c = other->parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, (a[i] - c[i]).abs().max().item<double>());
    }
    return worst;
  };
  // float64: 1e-10 states that each variant computes the same update.
  const std::vector<std::pair<const char*, MicroBatching>> variants = {
      {"one row per micro-batch", {.micro_batch = 1}},
      {"token budget of 14", {.micro_batch_tokens = 14}},
      {"packed, two rows", {.micro_batch = 2, .packed = true}},
      {"packed with a token budget", {.micro_batch_tokens = 16, .packed = true}},
      {"activation checkpointing", {.micro_batch = 2, .activation_checkpointing = true}},
  };
  for (const auto& [name, micro] : variants) {
    INFO(name);
    auto [net, metrics] = run(micro);
    CHECK(largest_difference(net) <= 1e-10);
    CHECK(metrics.at("grad_norm") == Approx(whole_metrics.at("grad_norm")).epsilon(1e-9));
    CHECK_FALSE(net->activation_checkpointing());  // Restored after the update.
  }
  CHECK(whole_metrics.at("optimizer_steps") == 1);
  for (const char* name : {"policy_loss", "clip_fraction", "clip_fraction_low", "approx_kl",
                           "entropy", "kl_loss", "grad_norm", "lr", "response_tokens_per_s"}) {
    CHECK(whole_metrics.count(name) == 1);
  }
  CHECK(whole_metrics.at("entropy") > 0);

  options.loop.mini_batch = 2;
  options.loop.epochs = 2;
  auto [epochs, epoch_metrics] = run({.micro_batch = 1});
  CHECK(epoch_metrics.at("optimizer_steps") == 4);
}

TEST_CASE("an on-policy update without old log-probs takes its own, detached (ratio 1)",
          "[train][update]") {
  // verl's actor with one epoch over one mini-batch: old_log_prob = log_prob.detach(). Against
  // the same update given the model's own log-probs from full logits (float64), the weights
  // agree to rounding; an off-policy update without them is refused.
  auto load = [] { return LoadFloat64Fixture("tiny-qwen2"); };
  at::manual_seed(23);
  const int64_t b = 4, t = 8;
  PolicyUpdateBatch batch;
  batch.input_ids = at::randint(3, 500, {b, t}, at::kLong);
  batch.attention_mask = at::ones({b, t}, at::kLong);
  batch.response_mask = at::zeros({b, t - 1}, at::kDouble);
  batch.response_mask.narrow(1, 3, t - 4).fill_(1);
  batch.advantages = at::randn({b, t - 1}, at::kDouble) * batch.response_mask;
  at::Tensor own;
  {
    model::Transformer reference = load();
    torch::NoGradGuard no_grad;
    own = TokenLogProbs(reference->Logits(reference->Hidden({batch.input_ids})).narrow(1, 0, t - 1),
                        batch.input_ids.narrow(1, 1, t - 1));
  }
  PolicyUpdateOptions options;
  options.loop.mini_batch = b;
  options.loop.lr = 1e-3;
  options.loop.micro = {.micro_batch = 2};
  options.entropy_coeff = 0.01;
  auto run = [&](const at::Tensor& old_log_probs) {
    model::Transformer net = load();
    LocalModel trained(net, {});
    PolicyUpdateBatch given = batch;
    given.old_log_probs = old_log_probs;
    auto metrics = UpdatePolicy(trained, given, options);
    REQUIRE(metrics.ok());
    return std::make_pair(net, *metrics);
  };
  auto [detached, detached_metrics] = run(at::Tensor());
  auto [given, given_metrics] = run(own);
  double worst = 0, moved = 0;
  const auto start = load()->parameters();
  for (size_t i = 0; i < start.size(); ++i) {
    worst = std::max(
        worst, (detached->parameters()[i] - given->parameters()[i]).abs().max().item<double>());
    moved = std::max(moved, (detached->parameters()[i] - start[i]).abs().max().item<double>());
  }
  CHECK(worst <= 1e-10);
  CHECK(moved > 1e-4);  // The update did something.
  CHECK(detached_metrics.at("approx_kl") == 0);
  CHECK(detached_metrics.at("clip_fraction") == 0);
  CHECK(detached_metrics.at("policy_loss") ==
        Approx(given_metrics.at("policy_loss")).margin(1e-10));

  options.loop.epochs = 2;
  model::Transformer net = load();
  LocalModel trained(net, {});
  const auto refused = UpdatePolicy(trained, batch, options);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("old_log_probs"));
}

// verl's agg_loss over a whole mini-batch (verl >= 0.9 with global batch information), written
// out with loops: rows without response tokens count in no denominator.
double VerlAggregate(const Matrix& loss, const Matrix& mask, v1::LossAggregation mode,
                     double horizon) {
  double total = 0, tokens = 0, sequences = 0, seq_sum = 0, seq_mean = 0;
  for (size_t i = 0; i < loss.size(); ++i) {
    double row_sum = 0, row_tokens = 0;
    for (size_t j = 0; j < loss[i].size(); ++j) {
      row_sum += loss[i][j] * mask[i][j];
      row_tokens += mask[i][j];
    }
    total += row_sum;
    tokens += row_tokens;
    if (row_tokens > 0) {
      sequences += 1;
      seq_sum += row_sum;
      seq_mean += row_sum / row_tokens;
    }
  }
  switch (mode) {
    case v1::LOSS_AGGREGATION_TOKEN_MEAN:
      return total / tokens;
    case v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM:
      return seq_sum / sequences;
    case v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN:
      return seq_mean / sequences;
    case v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM_NORM:
      return total / (sequences * horizon);
    default:
      FAIL("unknown mode");
      return 0;
  }
}

TEST_CASE("every loss aggregation equals verl's over the mini-batch, whatever the micro-batches",
          "[train][update][aggregation]") {
  // Aggregation of the masked PPO loss, checked in value and gradient against verl's formulas:
  // a float64 reference loss (per-token PPO loss, entropy bonus and k3 KL loss, each aggregated
  // over the whole batch by VerlAggregate) differentiated by autograd, against the gradient
  // UpdatePolicy accumulates (lr 0, no clipping) with each micro-batching.
  auto load = [] { return LoadFloat64Fixture("tiny-qwen2"); };
  at::manual_seed(31);
  const int64_t b = 6, t = 9;
  // Row 2 has no response token at all; row 4 has one.
  const std::vector<int64_t> lengths = {9, 7, 6, 9, 5, 8};
  const std::vector<int64_t> response_tokens = {5, 3, 0, 4, 1, 4};
  PolicyUpdateBatch batch;
  batch.input_ids = at::randint(3, 500, {b, t}, at::kLong);
  batch.attention_mask = at::zeros({b, t}, at::kLong);
  batch.response_mask = at::zeros({b, t - 1}, at::kDouble);
  for (int64_t i = 0; i < b; ++i) {
    batch.attention_mask[i].narrow(0, 0, lengths[i]).fill_(1);
    if (response_tokens[i] > 0) {
      batch.response_mask[i]
          .narrow(0, lengths[i] - 1 - response_tokens[i], response_tokens[i])
          .fill_(1);
    }
  }
  batch.advantages = at::randn({b, t - 1}, at::kDouble);
  {
    model::Transformer reference = load();
    torch::NoGradGuard no_grad;
    at::Tensor logits =
        reference->Logits(reference->Hidden({batch.input_ids, batch.attention_mask}))
            .narrow(1, 0, t - 1);
    // Old log-probs away from the current ones, so that some ratios clip.
    batch.old_log_probs = TokenLogProbs(logits, batch.input_ids.narrow(1, 1, t - 1)) +
                          0.3 * at::randn({b, t - 1}, at::kDouble);
  }
  batch.ref_log_probs = batch.old_log_probs + 0.05 * at::randn({b, t - 1}, at::kDouble);
  const double low = 0.2, high = 0.28, c = 3.0, entropy_coeff = 0.01, kl_coef = 0.1;
  const double horizon = 11;  // data.max_response_length: longer than any response here
  const Matrix mask = ToMatrix(batch.response_mask);

  for (const v1::LossAggregation mode :
       {v1::LOSS_AGGREGATION_TOKEN_MEAN, v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM,
        v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN, v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM_NORM}) {
    INFO(v1::LossAggregation_Name(mode));
    // The reference: full padded forward, per-token terms from full logits, verl's aggregation.
    model::Transformer reference = load();
    at::Tensor logits =
        reference->Logits(reference->Hidden({batch.input_ids, batch.attention_mask}))
            .narrow(1, 0, t - 1);
    const at::Tensor log_probs = at::log_softmax(logits, -1);
    const at::Tensor log_prob =
        log_probs.gather(-1, batch.input_ids.narrow(1, 1, t - 1).unsqueeze(-1)).squeeze(-1);
    const at::Tensor entropy = -(log_probs.exp() * log_probs).sum(-1);
    const at::Tensor ratio = (log_prob - batch.old_log_probs).clamp(-20, 20).exp();
    const at::Tensor& a = batch.advantages;
    const at::Tensor clip1 = at::maximum(-a * ratio, -a * ratio.clamp(1 - low, 1 + high));
    const at::Tensor pg = at::where(a.lt(0), at::minimum(clip1, -a * c), clip1);
    const at::Tensor delta = (batch.ref_log_probs - log_prob).clamp(-20, 20);
    const at::Tensor kl = (delta.exp() - delta - 1).clamp(-10, 10);
    // VerlAggregate is linear in the loss: aggregate with weights, then differentiate.
    const auto aggregate = [&](const at::Tensor& per_token) {
      at::Tensor total = at::zeros({}, at::kDouble);
      Matrix unit(b, std::vector<double>(t - 1, 0.0));
      for (int64_t i = 0; i < b; ++i) {
        for (int64_t j = 0; j < t - 1; ++j) {
          unit[i][j] = 1;
          const double weight = VerlAggregate(unit, mask, mode, horizon);
          unit[i][j] = 0;
          if (weight != 0) total = total + weight * per_token[i][j];
        }
      }
      return total;
    };
    const at::Tensor pg_loss = aggregate(pg);
    const at::Tensor total = pg_loss - entropy_coeff * aggregate(entropy) + kl_coef * aggregate(kl);
    total.backward();
    CHECK(pg_loss.item<double>() ==
          Approx(VerlAggregate(ToMatrix(pg.detach()), mask, mode, horizon)).epsilon(1e-12));

    for (const auto& [name, micro] : std::vector<std::pair<const char*, MicroBatching>>{
             {"one micro-batch", {.micro_batch = 6}},
             {"one row each", {.micro_batch = 1}},
             {"two rows each", {.micro_batch = 2}},
             {"token budget of 14", {.micro_batch_tokens = 14}},
             {"packed, three rows each", {.micro_batch = 3, .packed = true}},
             {"packed with a token budget", {.micro_batch_tokens = 16, .packed = true}}}) {
      INFO(name);
      model::Transformer net = load();
      LocalModel trained(net, {});
      PolicyUpdateOptions options;
      options.loop.mini_batch = b;
      options.loop.lr = 0;
      options.loop.grad_clip = 0;
      options.loop.loss_horizon = horizon;
      options.loop.micro = micro;
      options.policy = {low, high, c, mode};
      options.entropy_coeff = entropy_coeff;
      options.kl_coef = kl_coef;
      options.kl_estimator = v1::KL_ESTIMATOR_K3;
      auto metrics = UpdatePolicy(trained, batch, options);
      REQUIRE(metrics.ok());
      CHECK(metrics->at("policy_loss") == Approx(pg_loss.item<double>()).epsilon(1e-10));
      double worst = 0, largest = 0;
      auto ours = net->parameters(), theirs = reference->parameters();
      for (size_t i = 0; i < ours.size(); ++i) {
        worst = std::max(worst, (ours[i].grad() - theirs[i].grad()).abs().max().item<double>());
        largest = std::max(largest, theirs[i].grad().abs().max().item<double>());
      }
      INFO("largest gradient " << largest << ", largest difference " << worst);
      CHECK(largest > 1e-4);
      CHECK(worst <= 1e-10);
    }
  }
}

TEST_CASE("a malformed batch is refused naming the tensor", "[train][update]") {
  auto loaded = model::LoadModel(std::string(RLHFD_FIXTURES_DIR) + "/models/tiny-qwen2",
                                 {at::kDouble, at::kCPU});
  REQUIRE(loaded.ok());
  model::Transformer net = *loaded;
  LocalModel trained(net, {});
  PolicyUpdateBatch batch;
  batch.input_ids = at::randint(3, 500, {2, 5}, at::kLong);
  batch.response_mask = at::ones({2, 4}, at::kDouble);
  batch.old_log_probs = at::zeros({2, 4}, at::kDouble);
  batch.advantages = at::zeros({2, 3}, at::kDouble);
  PolicyUpdateOptions options;
  auto refused = UpdatePolicy(trained, batch, options);
  CHECK(absl::IsInvalidArgument(refused.status()));
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("advantages must be (2, 4)"));
  batch.advantages = at::zeros({2, 4}, at::kDouble);
  batch.input_ids[1][2] = 100000;
  refused = UpdatePolicy(trained, batch, options);
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("token id 100000 is outside the model's vocabulary"));
  batch.input_ids[1][2] = 7;
  options.kl_coef = 0.1;  // A KL loss needs reference log-probs.
  CHECK_THAT(std::string(UpdatePolicy(trained, batch, options).status().message()),
             Catch::Contains("ref_log_probs must be (2, 4)"));
  // A critic update on a model without a score head.
  CriticUpdateBatch critic;
  critic.input_ids = batch.input_ids;
  CHECK_THAT(std::string(UpdateCritic(trained, critic, {}).status().message()),
             Catch::Contains("needs a model with a one-label score head"));
}

TEST_CASE("FirstNonFinite finds the first tensor with a NaN or an infinity", "[train][nonfinite]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<at::Tensor> tensors = {at::ones({3}),
                                     at::arange(5, at::kLong),
                                     at::Tensor(),
                                     at::zeros({0}),
                                     at::full({2, 2}, 1e30, at::kDouble),
                                     at::ones({4})};
  CHECK_FALSE(FirstNonFinite(tensors).has_value());  // huge is still finite
  CHECK_FALSE(FirstNonFinite({}).has_value());
  tensors[5][2] = std::numeric_limits<float>::infinity();
  CHECK(FirstNonFinite(tensors) == 5u);
  tensors[4][1][0] = nan;
  CHECK(FirstNonFinite(tensors) == 4u);
  tensors[0][0] = -std::numeric_limits<float>::infinity();
  CHECK(FirstNonFinite(tensors) == 0u);
}

// A float64 batch for the tiny Qwen2 fixture whose rows `bad_rows` have NaN advantages.
PolicyUpdateBatch NonFiniteBatch(const std::vector<int64_t>& bad_rows) {
  at::manual_seed(31);
  const int64_t b = 4, t = 8;
  PolicyUpdateBatch batch;
  batch.input_ids = at::randint(3, 500, {b, t}, at::kLong);
  batch.attention_mask = at::ones({b, t}, at::kLong);
  batch.response_mask = at::zeros({b, t - 1}, at::kDouble);
  batch.response_mask.narrow(1, 3, t - 4).fill_(1);
  batch.advantages = at::randn({b, t - 1}, at::kDouble) * batch.response_mask;
  for (int64_t row : bad_rows) batch.advantages[row][4] = std::numeric_limits<double>::quiet_NaN();
  return batch;
}

TEST_CASE("a non-finite loss fails the update naming it; no weight changes", "[train][nonfinite]") {
  model::Transformer net = LoadFloat64Fixture("tiny-qwen2");
  const std::vector<at::Tensor> before = [&] {
    std::vector<at::Tensor> copies;
    for (const at::Tensor& p : net->parameters()) copies.push_back(p.detach().clone());
    return copies;
  }();
  LocalModel trained(net, {});
  PolicyUpdateOptions options;
  options.loop.mini_batch = 4;
  options.loop.lr = 1e-3;
  options.loop.role = "actor";
  const auto failed = UpdatePolicy(trained, NonFiniteBatch({2}), options);
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.status().code() == absl::StatusCode::kFailedPrecondition);
  const std::string message(failed.status().message());
  INFO(message);
  CHECK_THAT(message, Catch::Contains("actor: optimizer step 1 of this update"));
  CHECK_THAT(message, Catch::Contains("policy_loss is NaN"));
  CHECK_THAT(message, Catch::Contains("no update was applied"));
  CHECK_THAT(message, Catch::Contains("trainer.max_nonfinite_skips (0)"));
  const std::vector<at::Tensor> after = net->parameters();
  for (size_t i = 0; i < after.size(); ++i) CHECK(at::equal(after[i], before[i]));
  for (const at::Tensor& p : after) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("trainer.max_nonfinite_skips skips that many non-finite steps, then fails",
          "[train][nonfinite]") {
  // Two mini-batches of two rows; one holds the NaN row.
  PolicyUpdateOptions options;
  options.loop.mini_batch = 2;
  options.loop.lr = 1e-3;
  options.loop.role = "actor";
  options.loop.max_nonfinite_skips = 1;
  model::Transformer net = LoadFloat64Fixture("tiny-qwen2");
  const model::Transformer start = LoadFloat64Fixture("tiny-qwen2");
  LocalModel trained(net, {});
  PolicyUpdateBatch batch = NonFiniteBatch({1});
  batch.old_log_probs = at::full({4, 7}, -6.0, at::kDouble);  // off-policy: two mini-batches
  const auto skipped = UpdatePolicy(trained, batch, options);
  INFO(skipped.status().message());
  REQUIRE(skipped.ok());
  CHECK(skipped->at("nonfinite_skips") == 1);
  CHECK(skipped->at("optimizer_steps") == 2);
  // The skipped step's values are averaged in as they are: the means show it.
  CHECK(std::isnan(skipped->at("policy_loss")));
  CHECK(std::isnan(skipped->at("grad_norm")));
  // The other mini-batch's step was taken, and the weights are finite.
  double moved = 0;
  for (size_t i = 0; i < net->parameters().size(); ++i) {
    CHECK(at::isfinite(net->parameters()[i]).all().item<bool>());
    moved =
        std::max(moved, (net->parameters()[i] - start->parameters()[i]).abs().max().item<double>());
  }
  CHECK(moved > 1e-5);
  // The run has used its one skip: the next non-finite step fails.
  options.loop.nonfinite_skips_before = 1;
  const auto failed = UpdatePolicy(trained, batch, options);
  REQUIRE_FALSE(failed.ok());
  CHECK_THAT(std::string(failed.status().message()),
             Catch::Contains("trainer.max_nonfinite_skips (1) allows no more skipped steps (1 so "
                             "far)"));
}

TEST_CASE("an update that overflows the weights fails naming a parameter", "[train][nonfinite]") {
  // float32 weights: lr 1e39 is infinite in the fused AdamW kernel's float arithmetic.
  auto loaded = model::LoadModel(std::string(RLHFD_FIXTURES_DIR) + "/models/tiny-qwen2",
                                 {at::kFloat, at::kCPU});
  REQUIRE(loaded.ok());
  model::Transformer net = *loaded;
  LocalModel trained(net, {});
  PolicyUpdateBatch batch = NonFiniteBatch({});
  batch.advantages = batch.advantages.to(at::kFloat);
  batch.response_mask = batch.response_mask.to(at::kFloat);
  PolicyUpdateOptions options;
  options.loop.mini_batch = 4;
  options.loop.lr = 1e39;
  options.loop.role = "actor";
  options.loop.max_nonfinite_skips = 5;  // an overflowed weight is never skipped
  const auto failed = UpdatePolicy(trained, batch, options);
  REQUIRE_FALSE(failed.ok());
  const std::string message(failed.status().message());
  INFO(message);
  CHECK_THAT(message, Catch::Contains("actor: optimizer step 1 of this update"));
  CHECK_THAT(message, Catch::Contains("parameter model."));
  CHECK_THAT(message, Catch::Contains("holds non-finite values after the update (lr 1e+39"));
  CHECK_THAT(message, Catch::Contains("lower roles.actor.train.lr"));
}

TEST_CASE("micro-batches by a token budget", "[train][update]") {
  const std::vector<int64_t> tokens = {5, 9, 3, 7, 2, 12, 4};
  const std::vector<int64_t> rows = {6, 0, 1, 2, 3, 4, 5};
  const auto batches = SplitMicroBatches(rows, tokens, /*rows_per_micro_batch=*/2, /*budget=*/10);
  std::vector<int64_t> seen;
  for (const auto& batch : batches) {
    int64_t sum = 0;
    for (int64_t row : batch) sum += tokens[row];
    CHECK((sum <= 10 || batch.size() == 1));  // Row 5 (12 tokens) goes alone.
    // Rows keep the input order inside a micro-batch.
    std::vector<size_t> where;
    for (int64_t row : batch)
      where.push_back(std::find(rows.begin(), rows.end(), row) - rows.begin());
    CHECK(std::is_sorted(where.begin(), where.end()));
    seen.insert(seen.end(), batch.begin(), batch.end());
  }
  std::sort(seen.begin(), seen.end());
  CHECK(seen == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6});  // Every row exactly once.
  // First-fit by decreasing tokens: 12 | 9 | 7+3 | 5+4 | 2.
  CHECK(batches.size() == 5);
  // Without a budget: fixed row counts, in order.
  CHECK(SplitMicroBatches(rows, tokens, 3, 0) ==
        std::vector<std::vector<int64_t>>{{6, 0, 1}, {2, 3, 4}, {5}});
}

TEST_CASE("activation checkpointing gives the same gradients (float64)", "[train][checkpoint]") {
  auto loaded = model::LoadModel(std::string(RLHFD_FIXTURES_DIR) + "/models/tiny-qwen3",
                                 {at::kDouble, at::kCPU});
  REQUIRE(loaded.ok());
  model::Transformer net = *loaded;
  at::manual_seed(5);
  const at::Tensor ids = at::randint(3, 500, {2, 9}, at::kLong);
  const at::Tensor mask = at::ones({2, 9}, at::kLong).index_put_({1, at::indexing::Slice(6)}, 0);
  const at::Tensor weights = at::randn({2, 9, net->config().vocab_size}, at::kDouble);
  const auto gradients = [&](bool checkpointing) {
    net->set_activation_checkpointing(checkpointing);
    net->zero_grad();
    (net->Logits(net->Hidden({ids, mask})) * weights).sum().backward();
    std::vector<at::Tensor> grads;
    for (const auto& p : net->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const auto plain = gradients(false);
  const auto recomputed = gradients(true);
  double worst = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    worst = std::max(worst, (plain[i] - recomputed[i]).abs().max().item<double>());
  }
  INFO("largest gradient difference " << worst);
  CHECK(worst <= 1e-12);
}

TEST_CASE("explained variance, hand-worked", "[train][critic]") {
  const at::Tensor returns = ToTensor({{1, 2, 3, 4, 9}});
  const at::Tensor mask = ToTensor({{1, 1, 1, 1, 0}});
  // error = r - v = (0, 0, 0, -1): its variance 0.1875, the returns' 1.25.
  CHECK(ExplainedVariance(ToTensor({{1, 2, 3, 5, 0}}), returns, mask) == Approx(0.85));
  CHECK(ExplainedVariance(returns, returns, mask) == Approx(1.0));
  CHECK(ExplainedVariance(at::full_like(returns, 2.5), returns, mask) == Approx(0.0));
  CHECK(ExplainedVariance(returns, at::ones_like(returns), mask) == 0.0);  // Constant returns.
}

TEST_CASE("critic update: value loss falls, accumulation and packing change nothing",
          "[train][critic]") {
  auto load = [] { return LoadFloat64Fixture("tiny-llama-value"); };
  at::manual_seed(8);
  const int64_t b = 4, t = 7;
  CriticUpdateBatch batch;
  batch.input_ids = at::randint(3, 500, {b, t}, at::kLong);
  batch.attention_mask = at::ones({b, t}, at::kLong);
  batch.attention_mask[3].narrow(0, 5, 2).fill_(0);
  batch.response_mask = at::zeros({b, t - 1}, at::kDouble);
  batch.response_mask.narrow(1, 2, 4).fill_(1);
  batch.response_mask[3].narrow(0, 4, 2).fill_(0);
  batch.returns = at::randn({b, t - 1}, at::kDouble) * batch.response_mask;
  {
    model::Transformer reference = load();
    torch::NoGradGuard no_grad;
    batch.old_values = reference->Scores(reference->Hidden({batch.input_ids, batch.attention_mask}))
                           .squeeze(-1)
                           .narrow(1, 0, t - 1);
  }
  CriticUpdateOptions options;
  options.loop.mini_batch = 4;
  options.loop.lr = 1e-2;
  options.value_clip = 10.0;  // Let the values move freely here.
  auto run = [&](MicroBatching micro, int64_t epochs) {
    model::Transformer net = load();
    LocalModel trained(net, {});
    CriticUpdateOptions o = options;
    o.loop.micro = micro;
    o.loop.epochs = epochs;
    auto metrics = UpdateCritic(trained, batch, o);
    REQUIRE(metrics.ok());
    return std::make_pair(net, *metrics);
  };
  auto [whole, whole_metrics] = run({.micro_batch = 4}, 1);
  for (MicroBatching micro :
       {MicroBatching{.micro_batch = 1}, MicroBatching{.micro_batch = 2, .packed = true}}) {
    auto [net, metrics] = run(micro, 1);
    double worst = 0;
    auto a = whole->parameters(), c = net->parameters();
    for (size_t i = 0; i < a.size(); ++i)
      worst = std::max(worst, (a[i] - c[i]).abs().max().item<double>());
    CHECK(worst <= 1e-10);
    CHECK(metrics.at("explained_variance") ==
          Approx(whole_metrics.at("explained_variance")).epsilon(1e-9));
  }
  for (const char* name : {"value_loss", "value_clip_fraction", "values", "explained_variance",
                           "grad_norm", "lr", "optimizer_steps", "response_tokens_per_s"}) {
    CHECK(whole_metrics.count(name) == 1);
  }
  // Twenty epochs on the same batch: the values fit the returns better.
  auto [trained, trained_metrics] = run({.micro_batch = 4}, 20);
  torch::NoGradGuard no_grad;
  const at::Tensor values =
      trained->Scores(trained->Hidden({batch.input_ids, batch.attention_mask}))
          .squeeze(-1)
          .narrow(1, 0, t - 1);
  const double before = ExplainedVariance(batch.old_values, batch.returns, batch.response_mask);
  const double after = ExplainedVariance(values, batch.returns, batch.response_mask);
  INFO("explained variance " << before << " -> " << after);
  CHECK(after > before + 0.3);
  CHECK(trained_metrics.at("value_loss") < whole_metrics.at("value_loss"));
}

TEST_CASE("packed sequences give the same loss and gradients as the padded batch",
          "[train][packing]") {
  // float64, so the tolerance (1e-10) states that the two layouts compute the same function.
  auto loaded = model::LoadModel(std::string(RLHFD_FIXTURES_DIR) + "/models/tiny-qwen2",
                                 {at::kDouble, at::kCPU});
  REQUIRE(loaded.ok());
  model::Transformer net = *loaded;
  at::manual_seed(11);
  const std::vector<int64_t> lengths = {7, 3, 5};
  std::vector<at::Tensor> sequences;
  for (int64_t n : lengths) sequences.push_back(at::randint(3, 500, {n}, at::kLong));
  const at::Tensor advantages_per_seq = ToTensor({{0.7}, {-1.1}, {0.4}});
  PolicyLossOptions options{0.2, 0.28, 3.0, v1::LOSS_AGGREGATION_TOKEN_MEAN};

  auto gradients = [&](const at::Tensor& loss) {
    net->zero_grad();
    loss.backward();
    std::vector<at::Tensor> grads;
    for (const auto& p : net->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };

  // Padded: (3, 7) right-padded; scored tokens are positions 1..n-1 of each sequence.
  const int64_t t = 7;
  at::Tensor ids = at::zeros({3, t}, at::kLong), attention = at::zeros({3, t}, at::kLong);
  at::Tensor mask = at::zeros({3, t - 1}, at::kDouble);
  for (int64_t b = 0; b < 3; ++b) {
    ids[b].narrow(0, 0, lengths[b]).copy_(sequences[b]);
    attention[b].narrow(0, 0, lengths[b]).fill_(1);
    mask[b].narrow(0, 0, lengths[b] - 1).fill_(1);
  }
  at::Tensor logits = net->Logits(net->Hidden({ids, attention})).narrow(1, 0, t - 1);
  at::Tensor log_prob = TokenLogProbs(logits, ids.narrow(1, 1, t - 1));
  at::Tensor old = log_prob.detach() - 0.1;
  at::Tensor padded_loss =
      ComputePolicyLoss(log_prob, old, advantages_per_seq.expand({3, t - 1}), mask, options).loss;
  std::vector<at::Tensor> padded_grads = gradients(padded_loss);

  // Packed: one row of 15 tokens; each sequence's scored tokens gathered from its span.
  std::vector<int64_t> starts = {0};
  for (int64_t n : lengths) starts.push_back(starts.back() + n);
  model::ForwardBatch packed{at::cat(sequences).unsqueeze(0)};
  packed.cu_seqlens = at::tensor(starts, at::kLong);
  at::Tensor packed_logits = net->Logits(net->Hidden(packed)).squeeze(0);  // (15, V)
  std::vector<at::Tensor> lp, old_lp, adv;
  for (int64_t b = 0; b < 3; ++b) {
    const int64_t n = lengths[b];
    at::Tensor seq_lp = TokenLogProbs(packed_logits.narrow(0, starts[b], n - 1).unsqueeze(0),
                                      sequences[b].narrow(0, 1, n - 1).unsqueeze(0));
    lp.push_back(seq_lp.squeeze(0));
    old_lp.push_back(old[b].narrow(0, 0, n - 1));
    adv.push_back(advantages_per_seq[b].expand({n - 1}));
  }
  at::Tensor flat_mask = at::ones({1, starts.back() - 3}, at::kDouble);
  at::Tensor packed_loss = ComputePolicyLoss(at::cat(lp).unsqueeze(0), at::cat(old_lp).unsqueeze(0),
                                             at::cat(adv).unsqueeze(0), flat_mask, options)
                               .loss;
  CHECK(std::abs(packed_loss.item<double>() - padded_loss.item<double>()) <= 1e-10);
  std::vector<at::Tensor> packed_grads = gradients(packed_loss);
  REQUIRE(packed_grads.size() == padded_grads.size());
  double worst = 0;
  for (size_t i = 0; i < packed_grads.size(); ++i) {
    worst = std::max(worst, (packed_grads[i] - padded_grads[i]).abs().max().item<double>());
  }
  INFO("largest gradient difference " << worst);
  CHECK(worst <= 1e-10);
}

}  // namespace rlhfd::train

// verl's MFU pieces (verl/utils/flops_counter.py, 0.9.1): _estimate_qwen2_flops of this config
// over sequences of 3 and 5 tokens is 66,240 FLOPs (run there: 6 x 1,312 dense x 8 tokens +
// 6 x 34 x 4 x 2 x 2), and get_device_flops' figures by device name.
TEST_CASE("MFU: verl's FLOPs estimate and device peaks", "[train][mfu]") {
  rlhfd::model::ModelConfig config;
  config.hidden_size = 8;
  config.vocab_size = 10;
  config.num_layers = 2;
  config.num_heads = 2;
  config.num_kv_heads = 1;
  config.intermediate_size = 16;
  config.head_dim = 4;
  CHECK(rlhfd::train::TrainingFlops(config, {3, 5}) == 66240.0);
  CHECK(rlhfd::train::TrainingFlops(config, {}) == 0.0);
  CHECK(rlhfd::train::PromisedFlops("NVIDIA H200") == 989e12);
  CHECK(rlhfd::train::PromisedFlops("NVIDIA H20") == 148e12);
  CHECK(rlhfd::train::PromisedFlops("NVIDIA H100 80GB HBM3") == 989e12);
  CHECK(rlhfd::train::PromisedFlops("NVIDIA L40S") == 362.05e12);
  CHECK(rlhfd::train::PromisedFlops("CPU") == 448e9);
  CHECK(rlhfd::train::PromisedFlops("NVIDIA GeForce GTX 1080") == 0);
}
