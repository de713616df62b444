// The PPO policy loss (clip, clip-higher, dual clip) hand-worked and against a float64 reference
// in every aggregation mode; every policy loss (vanilla, GSPO, SAPO, CISPO, GPG, GMPO, Clip-Cov,
// KL-Cov, DPPO-TV, DPPO-KL, DRO) against verl's own functions, value and gradient; Clip-Cov's
// random draw; the clipped value loss, and the KL estimators k1, k2, k3.
#include "worker/train/losses.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "tests/unit/train/train_test_support.h"

namespace rlhfd::train {
namespace {

using testing::kMask;
using testing::Matrix;
using testing::ToTensor;

// The padded batch of the reference and verl cases (tests/fixtures/losses/verl_policy_losses.py
// has the same numbers), with train_test_support.h's kMask.
const Matrix kLogProb = {{-1.0, -0.5, -2.0, -0.1, -3.0},
                         {-0.2, -0.9, -1.1, 0, 0},
                         {-0.05, 0, 0, 0, 0},
                         {-1.5, -1.2, -0.3, -0.7, 0}};
const Matrix kOldLogProb = {{-1.2, -0.4, -1.0, -0.1, -3.5},
                            {-0.1, -1.4, -1.0, 0, 0},
                            {-1.0, 0, 0, 0, 0},
                            {-1.4, -1.3, -0.9, -0.2, 0}};
const Matrix kAdvantages = {{1.0, -0.5, 2.0, -1.5, 0.3},
                            {-2.0, 0.7, 0.1, 5, 5},
                            {-1.0, 5, 5, 5, 5},
                            {0.4, -0.8, 1.2, -0.3, 5}};

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
  const Matrix& log_prob = kLogProb;
  const Matrix& old = kOldLogProb;
  const Matrix& advantages = kAdvantages;
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
    PolicyLossOptions options{
        .clip_ratio_low = low, .clip_ratio_high = high, .clip_ratio_c = c, .aggregation = mode};
    PolicyLoss loss = ComputePolicyLoss(ToTensor(log_prob), ToTensor(old), ToTensor(advantages),
                                        ToTensor(kMask), options);
    CHECK(loss.loss.item<double>() == Approx(value).epsilon(1e-12));
  }
}

// The expected values are verl 0.9.1's own loss functions (core_algos.py) in float64 on this
// batch: tests/fixtures/losses/verl_policy_losses.py prints them.
TEST_CASE("every policy loss equals verl's, value and gradient", "[train][loss]") {
  struct Expected {
    v1::PolicyLoss mode;
    v1::LossAggregation aggregation;
    double loss;
    Matrix grad;  // of the loss with respect to log_prob
    double clip_fraction, clip_fraction_low, approx_kl;
  };
  const std::vector<Expected> verl = {
      {v1::POLICY_LOSS_VANILLA,
       v1::LOSS_AGGREGATION_TOKEN_MEAN,
       0.22721248826964607,
       {{0.0, 0.03480143915522922, -0.056596837103298825, 0.11538461538461539, 0.0},
        {0.13920575662091686, 0.0, -0.006960287831045843, -0.0, -0.0},
        {0.19890074302429586, -0.0, -0.0, -0.0, -0.0},
        {-0.027841151324183373, 0.06801051803542447, 0.0, 0.0, -0.0}},
       0.3846153843195266,
       0.0,
       -0.07307692302071005},
      {v1::POLICY_LOSS_VANILLA,
       v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN,
       0.691788934488227,
       {{0.0, 0.02262093540565712, -0.036787944043568346, 0.07499999985, 0.0},
        {0.15080623583663913, 0.0, -0.007540311791831958, -0.0, -0.0},
        {0.6464274083646875, -0.0, -0.0, -0.0, -0.0},
        {-0.02262093539434665, 0.055258545765636026, 0.0, 0.0, -0.0}},
       0.3846153843195266,
       0.0,
       -0.07307692302071005},
      {v1::POLICY_LOSS_GSPO,
       v1::LOSS_AGGREGATION_TOKEN_MEAN,
       0.17256482191556158,
       {{-0.07100894972204891, 0.035504474861024454, -0.14201789944409782, 0.10651342458307336,
         -0.021302684916614672},
        {0.17002629508856115, 0.0, 0.0, 0.0, 0.0},
        {0.19890074302429586, 0.0, 0.0, 0.0, 0.0},
        {-0.03154815755459781, 0.06309631510919562, -0.09464447266379344, 0.02366111816594836,
         -0.0}},
       0.15384615372781063,
       0.0,
       -0.07307692302071005},
      {v1::POLICY_LOSS_GSPO,
       v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN,
       0.668578901165233,
       {{-0.046155817227020154, 0.023077908613510077, -0.09231163445404031, 0.06923372584053022,
         -0.013846745168106047},
        {0.18419515239862408, 0.0, 0.0, 0.0, 0.0},
        {0.6464274083646875, 0.0, 0.0, 0.0, 0.0},
        {-0.02563287794902853, 0.05126575589805706, -0.07689863384708558, 0.019224658461771394,
         -0.0}},
       0.15384615372781063,
       0.0,
       -0.07307692302071005},
      {v1::POLICY_LOSS_SAPO,
       v1::LOSS_AGGREGATION_TOKEN_MEAN,
       0.150944614014293,
       {{-0.059416710261023624, 0.022303847494630488, -0.02961720831039331, 0.07499999985,
         -0.01969012906122671},
        {0.14869231643261344, -0.07657272402489577, -0.007502031859203381, -0.0, -0.0},
        {0.04726988041619973, -0.0, -0.0, -0.0, -0.0},
        {-0.022506095596365225, 0.0543144261144978, -0.09550747708421788, 0.00901109882537787,
         -0.0}},
       0.0,
       0.0,
       -0.07307692302071005},
      {v1::POLICY_LOSS_SAPO,
       v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN,
       0.150944614014293,
       {{-0.059416710261023624, 0.022303847494630488, -0.02961720831039331, 0.07499999985,
         -0.01969012906122671},
        {0.14869231643261344, -0.07657272402489577, -0.007502031859203381, -0.0, -0.0},
        {0.04726988041619973, -0.0, -0.0, -0.0, -0.0},
        {-0.022506095596365225, 0.0543144261144978, -0.09550747708421788, 0.00901109882537787,
         -0.0}},
       0.0,
       0.0,
       -0.07307692302071005},
      {v1::POLICY_LOSS_CISPO,
       v1::LOSS_AGGREGATION_TOKEN_MEAN,
       0.4068684803909352,
       {{-0.08076923076923077, 0.03480143915522922, -0.13846153846153847, 0.11538461538461539,
         -0.024230769230769233},
        {0.13920575662091686, -0.05653846153846154, -0.006960287831045843, -0.0, -0.0},
        {0.08076923076923077, -0.0, -0.0, -0.0, -0.0},
        {-0.027841151324183373, 0.06461538461538463, -0.09692307692307693, 0.020769230769230772,
         -0.0}},
       0.6153846149112425,
       0.0,
       -0.07307692302071005},
      {v1::POLICY_LOSS_CISPO,
       v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN,
       0.2638165307233475,
       {{-0.052499999895, 0.02262093540565712, -0.08999999982000001, 0.07499999985,
         -0.0157499999685},
        {0.15080623583663913, -0.06124999979583333, -0.007540311791831958, -0.0, -0.0},
        {0.26249999737500007, -0.0, -0.0, -0.0, -0.0},
        {-0.02262093539434665, 0.05249999986875001, -0.078749999803125, 0.0168749999578125, -0.0}},
       0.6153846149112425,
       0.0,
       -0.07307692302071005},
      {v1::POLICY_LOSS_GPG,
       v1::LOSS_AGGREGATION_TOKEN_MEAN,
       0.42923076923076925,
       {{-0.07692307692307693, 0.038461538461538464, -0.15384615384615385, 0.11538461538461539,
         -0.023076923076923078},
        {0.15384615384615385, -0.05384615384615385, -0.007692307692307693, -0.0, -0.0},
        {0.07692307692307693, -0.0, -0.0, -0.0, -0.0},
        {-0.03076923076923077, 0.06153846153846154, -0.09230769230769231, 0.023076923076923078,
         -0.0}},
       0.0,
       0.0,
       0.0},
      {v1::POLICY_LOSS_GPG,
       v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN,
       0.2777083328467014,
       {{-0.0499999999, 0.02499999995, -0.0999999998, 0.07499999985, -0.01499999997},
        {0.1666666661111111, -0.05833333313888889, -0.008333333305555557, -0.0, -0.0},
        {0.24999999750000004, -0.0, -0.0, -0.0, -0.0},
        {-0.024999999937500003, 0.049999999875000006, -0.0749999998125, 0.018749999953125, -0.0}},
       0.0,
       0.0,
       0.0},
      // geo_mean takes a mean over sequences whatever the aggregation says: both alike.
      {v1::POLICY_LOSS_GEO_MEAN,
       v1::LOSS_AGGREGATION_TOKEN_MEAN,
       0.6574710393183114,
       {{0.0, -0.010643499751697164, -0.010643499751697164, -0.010643499751697164, 0.0},
        {0.03170764727725743, 0.0, 0.03170764727725743, 0.0, 0.0},
        {0.6464273957593533, 0.0, 0.0, 0.0, 0.0},
        {-0.007715451528022298, -0.007715451528022298, 0.0, 0.0, -0.0}},
       0.5384615380473372,
       0.23076923059171597,
       -0.07307692302071005},
      {v1::POLICY_LOSS_GEO_MEAN,
       v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN,
       0.6574710393183114,
       {{0.0, -0.010643499751697164, -0.010643499751697164, -0.010643499751697164, 0.0},
        {0.03170764727725743, 0.0, 0.03170764727725743, 0.0, 0.0},
        {0.6464273957593533, 0.0, 0.0, 0.0, 0.0},
        {-0.007715451528022298, -0.007715451528022298, 0.0, 0.0, -0.0}},
       0.5384615380473372,
       0.23076923059171597,
       -0.07307692302071005},
      // Clip-Cov leaves out all six tokens it may draw from (its ratio 1; the script's
      // PolicyLossConfig), so no random choice is left to match; KL-Cov penalises two.
      {v1::POLICY_LOSS_CLIP_COV,
       v1::LOSS_AGGREGATION_TOKEN_MEAN,
       -0.22627862676018204,
       {{0.0, 0.0, -0.056596837103298825, 0.0, 0.0},
        {0.0, 0.0, -0.0, -0.0, -0.0},
        {0.0, -0.0, -0.0, -0.0, -0.0},
        {-0.0, 0.06801051803542447, 0.0, 0.0, -0.0}},
       0.46153846118343195,
       0.0,
       -0.07307692302071005},
      {v1::POLICY_LOSS_CLIP_COV,
       v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN,
       -0.17290439778257818,
       {{0.0, 0.0, -0.036787944043568346, 0.0, 0.0},
        {0.0, 0.0, -0.0, -0.0, -0.0},
        {0.0, -0.0, -0.0, -0.0, -0.0},
        {-0.0, 0.055258545765636026, 0.0, 0.0, -0.0}},
       0.46153846118343195,
       0.0,
       -0.07307692302071005},
      {v1::POLICY_LOSS_KL_COV,
       v1::LOSS_AGGREGATION_TOKEN_MEAN,
       0.0953119196992523,
       {{-0.09395405832001306, 0.03480143915522922, -0.056596837103298825, 0.11538461538461539,
         -0.03804741393923373},
        {0.13920575662091686, -0.08877729919154535, -0.006960287831045843, 0.0, 0.0},
        {0.19890074302429586, 0.0, 0.0, 0.0, 0.0},
        {-0.027841151324183373, 0.07570282572773217, -0.16050327388220084, 0.013996861377983848,
         0.0}},
       0.0,
       0.0,
       0.36538461510355036},
      {v1::POLICY_LOSS_KL_COV,
       v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN,
       0.5802761102016439,
       {{-0.06107013778586822, 0.02262093540565712, -0.036787944043568346, 0.07499999985,
         -0.024730819011040284},
        {0.15080623583663913, -0.09617540713692277, -0.007540311791831958, 0.0, 0.0},
        {0.6464274083646875, 0.0, 0.0, 0.0, 0.0},
        {-0.02262093539434665, 0.06150854575001102, -0.1304089097032659, 0.011372449841180752,
         0.0}},
       0.0,
       0.0,
       0.36538461510355036},
      // DPPO truncates at clip_ratio_c 3 and bounds the move by low 0.1 / high 0.05; DRO at
      // dro_beta 0.5 (the script's PolicyLossConfig).
      {v1::POLICY_LOSS_DPPO_TV,
       v1::LOSS_AGGREGATION_TOKEN_MEAN,
       0.12841596839074063,
       {{-0.0, 0.03480143915522922, -0.056596837103298825, 0.11538461538461539,
         -0.03804741393923373},
        {0.13920575662091686, -0.0, -0.006960287831045843, -0.0, -0.0},
        {0.19890074302429586, -0.0, -0.0, -0.0, -0.0},
        {-0.027841151324183373, 0.06801051803542449, -0.0, 0.0, -0.0}},
       0.30769230745562126,
       0.0,
       -0.07307692302071005},
      {v1::POLICY_LOSS_DPPO_TV,
       v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN,
       0.04239075099063867,
       {{-0.0, 0.02262093540565712, -0.036787944043568346, 0.07499999985, -0.024730819011040284},
        {0.15080623583663913, -0.0, -0.007540311791831958, -0.0, -0.0},
        {0.6464274083646875, -0.0, -0.0, -0.0, -0.0},
        {-0.02262093539434665, 0.055258545765636026, -0.0, 0.0, -0.0}},
       0.30769230745562126,
       0.0,
       -0.07307692302071005},
      {v1::POLICY_LOSS_DPPO_KL,
       v1::LOSS_AGGREGATION_TOKEN_MEAN,
       0.22237002671075368,
       {{-0.09395405832001306, 0.03480143915522922, -0.056596837103298825, 0.11538461538461539,
         -0.03804741393923373},
        {0.13920575662091686, -0.0, -0.006960287831045843, -0.0, -0.0},
        {0.19890074302429586, -0.0, -0.0, -0.0, -0.0},
        {-0.027841151324183373, 0.06801051803542449, -0.0, 0.0, -0.0}},
       0.23076923059171597,
       0.0,
       -0.07307692302071005},
      {v1::POLICY_LOSS_DPPO_KL,
       v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN,
       0.1034608887765069,
       {{-0.06107013778586822, 0.02262093540565712, -0.036787944043568346, 0.07499999985,
         -0.024730819011040284},
        {0.15080623583663913, -0.0, -0.007540311791831958, -0.0, -0.0},
        {0.6464274083646875, -0.0, -0.0, -0.0, -0.0},
        {-0.02262093539434665, 0.055258545765636026, -0.0, 0.0, -0.0}},
       0.23076923059171597,
       0.0,
       -0.07307692302071005},
      {v1::POLICY_LOSS_DRO,
       v1::LOSS_AGGREGATION_TOKEN_MEAN,
       0.48889423076923083,
       {{-0.06923076923076923, 0.03461538461538462, -0.19230769230769232, 0.11538461538461539,
         -0.0038461538461538464},
        {0.15000000000000002, -0.03461538461538462, -0.011538461538461543, 0.0, 0.0},
        {0.11346153846153847, 0.0, 0.0, 0.0, 0.0},
        {-0.03461538461538462, 0.06538461538461539, -0.06923076923076923, 0.00384615384615385,
         0.0}},
       0.0,
       0.0,
       -0.07307692302071005},
      {v1::POLICY_LOSS_DRO,
       v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN,
       0.36583333220677944,
       {{-0.044999999910000005, 0.022499999955000002, -0.12499999975000001, 0.07499999985,
         -0.002499999995},
        {0.16249999945833332, -0.037499999875, -0.012499999958333338, 0.0, 0.0},
        {0.36874999631250005, 0.0, 0.0, 0.0, 0.0},
        {-0.028124999929687505, 0.05312499986718751, -0.056249999859375, 0.0031249999921875004,
         0.0}},
       0.0,
       0.0,
       -0.07307692302071005}};
  const Matrix& log_prob = kLogProb;
  const Matrix& old = kOldLogProb;
  const Matrix& advantages = kAdvantages;
  for (const Expected& expected : verl) {
    INFO(v1::PolicyLoss_Name(expected.mode)
         << " " << v1::LossAggregation_Name(expected.aggregation));
    const PolicyLossOptions options{.mode = expected.mode,
                                    .clip_ratio_low = 0.1,
                                    .clip_ratio_high = 0.05,
                                    .clip_ratio_c = 3.0,
                                    .tau_pos = 1.5,
                                    .tau_neg = 2.5,
                                    .clip_cov_ratio = 1.0,
                                    .clip_cov_lb = -1.6,
                                    .clip_cov_ub = 0.1,
                                    .kl_cov_ratio = 0.2,
                                    .ppo_kl_coef = 0.1,
                                    .dro_beta = 0.5,
                                    .aggregation = expected.aggregation};
    const at::Tensor current = ToTensor(log_prob).requires_grad_(true);
    const PolicyLoss loss =
        ComputePolicyLoss(current, ToTensor(old), ToTensor(advantages), ToTensor(kMask), options);
    // verl's means divide by count + 1e-8: agreement to 1e-7 relative.
    CHECK(loss.loss.item<double>() == Approx(expected.loss).epsilon(1e-7));
    loss.loss.backward();
    testing::CheckClose(testing::ToMatrix(current.grad()), expected.grad, 1e-8);
    CHECK(loss.clip_fraction.item<double>() == Approx(expected.clip_fraction).epsilon(1e-7));
    CHECK(loss.clip_fraction_low.item<double>() ==
          Approx(expected.clip_fraction_low).epsilon(1e-7));
    // verl's GPG reports no KL (0 above); rlhfd reports the same mean of old - new as the others.
    const double kl =
        expected.mode == v1::POLICY_LOSS_GPG ? verl.front().approx_kl : expected.approx_kl;
    CHECK(loss.approx_kl.item<double>() == Approx(kl).epsilon(1e-7));
  }
}

// Clip-Cov's random draw: of the six tokens it may leave out on the verl case's batch (unclipped,
// covariance in (-1.6, 0.1)), a ratio of 0.2 leaves out ⌊0.2 · 13⌋ = 2, chosen by the generator:
// the same two for the same seed, and the loss is the PPO loss of the other tokens.
TEST_CASE("clip_cov leaves out a random draw of its candidate tokens", "[train][loss]") {
  const at::Tensor log_prob = ToTensor(kLogProb);
  const at::Tensor old = ToTensor(kOldLogProb);
  const at::Tensor advantages = ToTensor(kAdvantages);
  const at::Tensor mask = ToTensor(kMask);
  // (row, column) of the six candidates, from the script's covariances.
  const std::set<std::pair<int64_t, int64_t>> candidates = {{0, 1}, {0, 3}, {1, 0},
                                                            {1, 2}, {2, 0}, {3, 0}};
  const auto left_out = [&](uint64_t seed) {
    PolicyLossOptions options{.mode = v1::POLICY_LOSS_CLIP_COV,
                              .clip_ratio_low = 0.1,
                              .clip_ratio_high = 0.05,
                              .clip_cov_ratio = 0.2,
                              .clip_cov_lb = -1.6,
                              .clip_cov_ub = 0.1};
    options.generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    const at::Tensor current = log_prob.clone().requires_grad_(true);
    const PolicyLoss loss = ComputePolicyLoss(current, old, advantages, mask, options);
    CHECK(loss.clip_fraction.item<double>() == Approx(2.0 / 13));
    // The loss is vanilla's per-token loss without dual clip over the tokens kept, / 13.
    const at::Tensor ratio = (log_prob - old).exp();
    const at::Tensor per_token =
        at::maximum(-advantages * ratio, -advantages * ratio.clamp(0.9, 1.05)) * mask;
    loss.loss.backward();
    std::set<std::pair<int64_t, int64_t>> out;
    double kept_sum = 0;
    for (int64_t i = 0; i < 4; ++i) {
      for (int64_t j = 0; j < 5; ++j) {
        if (kMask[i][j] == 0) continue;
        // A left-out token has no gradient and no loss; only candidates can be left out, and
        // the candidates are unclipped, so a candidate kept has a gradient of -A·r / 13.
        const double grad = current.grad()[i][j].item<double>();
        const bool candidate = candidates.count({i, j}) > 0;
        if (candidate && grad == 0) {
          out.insert({i, j});
        } else {
          kept_sum += per_token[i][j].item<double>();
        }
      }
    }
    CHECK(loss.loss.item<double>() == Approx(kept_sum / 13).epsilon(1e-12));
    return out;
  };
  const auto first = left_out(7);
  CHECK(first.size() == 2);
  CHECK(left_out(7) == first);
  // Another seed draws other tokens for at least one of these seeds (15 pairs to draw from).
  bool another = false;
  for (uint64_t seed : {8, 9, 10, 11}) another = another || left_out(seed) != first;
  CHECK(another);
}

// The update loop adds micro-batches' losses up to the mini-batch's: geo_mean's mean over the
// mini-batch's sequences (scale.sequences), not over a micro-batch's (verl's torch.mean, whose
// gradient grows with the number of micro-batches), adds up too.
TEST_CASE("geo_mean over micro-batches adds up to the mini-batch's loss", "[train][loss]") {
  at::manual_seed(3);
  const at::Tensor mask = ToTensor(kMask);
  const at::Tensor log_prob = -at::rand(mask.sizes(), at::kDouble) * 2;
  const at::Tensor old = -at::rand(mask.sizes(), at::kDouble) * 2;
  const at::Tensor advantages = at::randn(mask.sizes(), at::kDouble);
  const PolicyLossOptions options{
      .mode = v1::POLICY_LOSS_GEO_MEAN, .clip_ratio_low = 0.2, .clip_ratio_high = 0.28};
  const LossScale scale = LossScaleOf(mask);
  const double whole =
      ComputePolicyLoss(log_prob, old, advantages, mask, options, scale).loss.item<double>();
  double parts = 0;
  for (const auto& rows : {std::vector<int64_t>{0, 2}, std::vector<int64_t>{1, 3}}) {
    const at::Tensor index = at::tensor(rows, at::kLong);
    parts += ComputePolicyLoss(log_prob.index_select(0, index), old.index_select(0, index),
                               advantages.index_select(0, index), mask.index_select(0, index),
                               options, scale)
                 .loss.item<double>();
  }
  CHECK(parts == Approx(whole).epsilon(1e-12));
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
