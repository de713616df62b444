#include "worker/train/rollout_correction.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"

namespace rlhfd::train {
namespace {

constexpr double kSafetyBound = 20.0;  // verl's SAFETY_BOUND on log-ratios before exp

double Item(const at::Tensor& scalar) { return scalar.to(at::kDouble).item<double>(); }

// Runs `compute`, which fills this rank's `sums` (`count` of them) and `maxima`, and reduces both
// over the replicas (sums added, maxima the largest). A failure here is shared through the sums
// (one more counts failed ranks), so that every rank enters the same reductions and none waits
// for another; `what` names the figures in the error.
absl::Status ComputeAndReduce(size_t count, std::vector<double>& sums, std::vector<double>& maxima,
                              const std::function<void()>& compute, absl::string_view what,
                              const ReplicaSum& reduce) {
  std::string failure;
  try {
    compute();
  } catch (const std::exception& error) {
    failure = std::string(error.what()).substr(0, 300);
    sums.assign(count, 0.0);
  }
  sums.push_back(failure.empty() ? 0.0 : 1.0);
  RETURN_IF_ERROR(reduce(sums, /*maximum=*/false));
  if (!failure.empty()) return absl::InternalError(absl::StrCat(what, ": ", failure));
  if (sums.back() > 0) {
    return absl::InternalError(absl::StrCat(what, " failed on another replica (its log says why)"));
  }
  sums.pop_back();
  return reduce(maxima, /*maximum=*/true);
}

}  // namespace

absl::StatusOr<RolloutCorrection> ComputeRolloutCorrection(const at::Tensor& old_log_probs,
                                                           const at::Tensor& rollout_log_probs,
                                                           const at::Tensor& response_mask,
                                                           const RolloutCorrectionOptions& options,
                                                           const ReplicaSum& reduce) {
  at::NoGradGuard no_grad;
  at::Tensor weights;
  std::vector<double> sums, extremes(2, 0.0);
  RETURN_IF_ERROR(ComputeAndReduce(
      9, sums, extremes,
      [&] {
        const at::Tensor mask = response_mask.to(at::kDouble);
        const at::Tensor old = old_log_probs.to(at::kDouble);
        const at::Tensor rollout = rollout_log_probs.to(at::kDouble);
        const at::Tensor log_ratio = old - rollout;
        // The raw weights (zero past each response), and what the high/low fractions count
        // over: tokens, or for "sequence" one log-ratio sum per response with tokens.
        at::Tensor raw, ratio_for_fractions, counted;
        if (options.sequence) {
          const at::Tensor sequence_sums = (log_ratio * mask).sum(1, /*keepdim=*/true);
          raw = sequence_sums.clamp(-kSafetyBound, kSafetyBound).exp().expand_as(log_ratio) * mask;
          ratio_for_fractions = sequence_sums.squeeze(1);
          counted = mask.sum(1).gt(0).to(at::kDouble);
        } else {
          raw = log_ratio.clamp(-kSafetyBound, kSafetyBound).exp() * mask;
          ratio_for_fractions = log_ratio;
          counted = mask;
        }
        weights = raw.clamp_max(options.threshold);
        const double log_high = std::log(options.threshold), log_low = -log_high;
        sums = {
            Item(mask.sum()),
            Item((weights * mask).sum()),
            Item(counted.sum()),
            Item((ratio_for_fractions.gt(log_high).to(at::kDouble) * counted).sum()),
            Item((ratio_for_fractions.lt(log_low).to(at::kDouble) * counted).sum()),
            Item(((rollout - old) * mask).sum()),
            Item(((log_ratio.exp() - log_ratio - 1) * mask).sum()),
            Item(mask.sum(1).gt(0).to(at::kDouble).sum()),
            Item((weights.sum(1) / mask.sum(1).clamp_min(1)).sum()),  // each response's mean
        };
        // Extremes, as verl: of the weights applied ("token"), of the raw sequence weights in
        // log space ("sequence"); the smallest as the largest negation.
        const double infinity = std::numeric_limits<double>::infinity();
        const at::Tensor of = options.sequence ? ratio_for_fractions : weights;
        const at::Tensor among = options.sequence ? counted.gt(0) : mask.gt(0);
        extremes = {Item(of.masked_fill(among.logical_not(), -infinity).max()),
                    -Item(of.masked_fill(among.logical_not(), infinity).min())};
      },
      "the rollout correction's weights", reduce));
  if (options.sequence) {
    extremes[0] = std::exp(std::min(extremes[0], kSafetyBound));
    extremes[1] = -std::exp(-extremes[1]);
  }
  const double tokens = std::max(sums[0], 1.0), responses = std::max(sums[2], 1.0);
  RolloutCorrection out;
  auto& metrics = out.metrics;
  metrics["rollout_corr/rollout_is_mean"] = sums[1] / tokens;
  metrics["rollout_corr/rollout_is_max"] = extremes[0];
  metrics["rollout_corr/rollout_is_min"] = -extremes[1];
  metrics["rollout_corr/rollout_is_ratio_fraction_high"] = sums[3] / responses;
  metrics["rollout_corr/rollout_is_ratio_fraction_low"] = sums[4] / responses;
  metrics["rollout_corr/kl"] = sums[5] / tokens;
  metrics["rollout_corr/k3_kl"] = sums[6] / tokens;
  if (options.batch_normalize) {
    // Over tokens ("token") or over responses' mean weights ("sequence"), as verl.
    const double mean = options.sequence ? sums[8] / std::max(sums[7], 1.0) : sums[1] / tokens;
    if (mean > 1e-8) weights = weights / mean;
    metrics["rollout_corr/rollout_is_batch_norm_factor"] = mean > 1e-8 ? mean : 1.0;
  }
  out.weights = weights.to(at::kFloat);
  return out;
}

absl::StatusOr<std::map<std::string, double>> RolloutProbsDiffMetrics(
    const at::Tensor& old_log_probs, const at::Tensor& rollout_log_probs,
    const at::Tensor& response_mask, const ReplicaSum& reduce) {
  at::NoGradGuard no_grad;
  std::vector<double> sums, largest = {0.0};
  RETURN_IF_ERROR(ComputeAndReduce(
      8, sums, largest,
      [&] {
        const at::Tensor mask = response_mask.to(at::kDouble);
        const at::Tensor rollout = rollout_log_probs.to(at::kDouble).exp() * mask;
        const at::Tensor actor = old_log_probs.to(at::kDouble).exp() * mask;
        const at::Tensor diff = (rollout - actor).abs();
        sums = {Item(mask.sum()),
                Item(diff.sum()),
                Item((diff * diff).sum()),
                Item(rollout.sum()),
                Item(actor.sum()),
                Item((rollout * rollout).sum()),
                Item((actor * actor).sum()),
                Item((rollout * actor).sum())};
        // diff is 0 outside the mask, and |.| >= 0 inside; a replica without rows adds 0.
        largest = {diff.numel() == 0 ? 0.0 : Item(diff.max())};
      },
      "training/rollout_probs_diff", reduce));
  std::map<std::string, double> metrics;
  const double n = sums[0];
  if (n < 1) return metrics;  // no response tokens: nothing to compare
  const double mean = sums[1] / n;
  // Sums of squares less n times the squared mean: clamped at 0 against rounding.
  const auto centred = [n](double sum, double square_sum) {
    return std::max(0.0, square_sum - sum * sum / n);
  };
  metrics["training/rollout_probs_diff_valid"] = 1;
  metrics["training/rollout_probs_diff_max"] = largest[0];
  metrics["training/rollout_probs_diff_mean"] = mean;
  metrics["training/rollout_probs_diff_std"] =
      n > 1 ? std::sqrt(centred(sums[1], sums[2]) / (n - 1)) : 0.0;
  const double spread = std::sqrt(centred(sums[3], sums[5]) * centred(sums[4], sums[6]));
  if (spread > 0) {
    metrics["training/rollout_actor_probs_pearson_corr"] =
        (sums[7] - sums[3] * sums[4] / n) / spread;
  }
  return metrics;
}

}  // namespace rlhfd::train
