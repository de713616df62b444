// The PPO policy loss (clip, clip-higher, dual clip) hand-worked and against a float64 reference
// in every aggregation mode, the clipped value loss, and the KL estimators k1, k2, k3.
#include "worker/train/losses.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>

#include "tests/unit/train/train_test_support.h"

namespace rlhfd::train {
namespace {

using testing::kMask;
using testing::Matrix;
using testing::ToTensor;

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

}  // namespace
}  // namespace rlhfd::train
