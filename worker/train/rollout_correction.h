// verl's rollout correction (algorithm.rollout_correction): truncated importance sampling between
// the policy being trained and the one the rollout sampled with, whose weights multiply each
// token's policy loss. They matter when the two differ: a rollout whose weights lag the trainer's
// (trainer.mode one_step_off), or rollout arithmetic that differs from training's.
//
//   token:    w_t = min(exp(old_t - rollout_t), threshold)
//   sequence: w   = min(exp(Σ_t (old_t - rollout_t)), threshold), for every token of the response
// with the log-ratio clamped to ±20 before exp, zero past each response; optionally divided by
// their mean over the batch's tokens (token) or responses (sequence). Shapes (rows, R).
#pragma once

#include <ATen/Tensor.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rlhfd::train {

struct RolloutCorrectionOptions {
  bool sequence = false;  // "sequence", else "token"
  double threshold = 2.0;
  bool batch_normalize = false;
};

// Sums `values` over the data-parallel replicas in place, or takes their maxima
// (TrainedModel::ReduceOverReplicas): batch means and extremes are over every rank's rows.
using ReplicaSum = std::function<absl::Status(std::vector<double>& values, bool maximum)>;

struct RolloutCorrection {
  at::Tensor weights;  // (rows, R) float32, detached
  // verl's names under rollout_corr/: rollout_is_mean / _max / _min (the weights applied, before
  // batch normalisation), rollout_is_ratio_fraction_high / _low (raw weights above the threshold
  // or below its reciprocal; sequences for "sequence"), rollout_is_batch_norm_factor, and the
  // off-policy gap: kl (mean of rollout - old) and k3_kl (mean of exp(d) - d - 1, d = old -
  // rollout).
  std::map<std::string, double> metrics;
};

// verl's check that the rollout and the trainer agree on the sampled tokens' probabilities (what
// its rollout.calculate_log_probs adds: training/rollout_probs_diff_max / _mean / _std over
// |exp(rollout)
// - exp(old)| of the response tokens, std unbiased as torch.std, and
// training/rollout_actor_probs_pearson_corr of the two probabilities), over every replica's
// tokens. verl's FAQ: a mean above 0.01 means the inference engine's arithmetic is off; a collapse
// that follows a rising mean is the training-inference mismatch, not the algorithm.
absl::StatusOr<std::map<std::string, double>> RolloutProbsDiffMetrics(
    const at::Tensor& old_log_probs, const at::Tensor& rollout_log_probs,
    const at::Tensor& response_mask, const ReplicaSum& reduce);

absl::StatusOr<RolloutCorrection> ComputeRolloutCorrection(const at::Tensor& old_log_probs,
                                                           const at::Tensor& rollout_log_probs,
                                                           const at::Tensor& response_mask,
                                                           const RolloutCorrectionOptions& options,
                                                           const ReplicaSum& reduce);

}  // namespace rlhfd::train
