// RL losses on token tensors, following verl's definitions so a verl run translates one to one:
// loss aggregation, the PPO clipped policy loss (clip-higher, dual clip), the clipped value loss,
// KL estimators and the fixed/adaptive KL coefficient.
//
// Aggregation follows verl >= 0.9 (core_algos.agg_loss with global batch information, verl PR
// #4510): the denominators are those of the whole mini-batch, whatever micro-batches (and, with
// data parallelism, ranks) it is cut into, and sequences without a response token count in none.
//
// Shapes: B = sequences, T = response tokens (right-padded); `mask` (B, T) is 1 on real tokens.
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/Generator.h>

#include <optional>

#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::train {

// The denominators of an aggregated loss, counted over a whole mini-batch.
struct LossScale {
  double tokens = 0;     // response tokens
  double sequences = 0;  // sequences with at least one response token
  // T of seq-mean-token-sum-norm: verl's loss_scale_factor, by default its padded response
  // length (data.max_response_length).
  double horizon = 0;
};

// The scale of `mask` (B, T) taken as a whole mini-batch; `horizon` 0 means mask's T.
LossScale LossScaleOf(const at::Tensor& mask, double horizon = 0);

// Reduces per-token `loss` (B, T) of one micro-batch to its share of the mini-batch's loss, so
// the shares of all micro-batches sum to (with n_i = row i's tokens, rows with n_i = 0 left out):
//   token-mean: Σ loss·mask / tokens
//   seq-mean-token-sum: Σ_i Σ_t loss·mask / sequences
//   seq-mean-token-mean: Σ_i (Σ_t loss·mask / n_i) / sequences
//   seq-mean-token-sum-norm: Σ loss·mask / (sequences · horizon)   (Dr. GRPO)
// Without a scale the batch is its own mini-batch.
at::Tensor AggregateLoss(const at::Tensor& loss, const at::Tensor& mask, v1::LossAggregation mode,
                         const std::optional<LossScale>& scale = std::nullopt);

// sum(x·mask) / sum(mask), a scalar.
at::Tensor MaskedMean(const at::Tensor& x, const at::Tensor& mask);

struct PolicyLossOptions {
  v1::PolicyLoss mode = v1::POLICY_LOSS_VANILLA;  // UNSPECIFIED: vanilla
  double clip_ratio_low = 0.2;
  double clip_ratio_high = 0.2;
  double clip_ratio_c = 3.0;  // Dual clip for negative advantages (vanilla); 0 turns it off.
  double tau_pos = 1.0;       // SAPO's gate temperatures (A > 0, A <= 0)
  double tau_neg = 1.05;
  double clip_cov_ratio = 0.0002;  // Clip-Cov: share of tokens left out, their covariance bounds
  double clip_cov_lb = 1.0;
  double clip_cov_ub = 5.0;
  double kl_cov_ratio = 0.0002;  // KL-Cov: share of tokens penalised, the penalty's coefficient
  double ppo_kl_coef = 0.1;
  double dro_beta = 0;  // DRO's quadratic penalty
  v1::LossAggregation aggregation = v1::LOSS_AGGREGATION_TOKEN_MEAN;
  // Clip-Cov's random draw of the tokens it leaves out (a CPU generator); ATen's default when
  // unset.
  std::optional<at::Generator> generator;
};

struct PolicyLoss {
  at::Tensor loss;               // scalar, differentiable in log_prob
  at::Tensor clip_fraction;      // share of tokens where the (1±ε) clip was active
  at::Tensor clip_fraction_low;  // share of tokens where the dual clip (c) was active
  at::Tensor approx_kl;          // masked mean of old_log_prob - log_prob
};

// The policy loss of options.mode, per token as verl 0.9's core_algos.py (δ = log_prob -
// old_log_prob, ε = low / high, A the advantage):
//   vanilla  PPO's clipped surrogate, r = exp(δ) (δ clamped to ±20): max(-A·r, -A·clip(r, 1 - ε,
//            1 + ε)), and for A < 0 at most -A·c.
//   gspo     the same with one ratio per sequence, s = exp(mean of the row's δ), carried to each
//            token as s · π/sg[π] (log clamped at 10); no dual clip.
//   sapo     -A·g(r) with the gate g(r) = σ(τ·(r - 1))·4/τ, τ = tau_pos where A > 0 else tau_neg;
//            aggregated as seq-mean-token-mean whatever options.aggregation says.
//   cispo    -sg[clip(r, 1 - ε, 1 + ε)]·A·log_prob.
//   gpg      -A·log_prob.
//   geo_mean one ratio per sequence, exp(mean of the row's sgn(A)·min(sgn(A)·δ, sgn(A)·clip(δ,
//            -low, high))) (δ not clamped), times the row's mean A: -Ā·r per sequence, a mean
//            over the mini-batch's sequences (scale.sequences) whatever options.aggregation
//            says; clip_fraction counts clipped tokens with A > 0, clip_fraction_low with A < 0.
//   clip_cov PPO's clipped surrogate, r = exp(δ) unclamped, no dual clip; of the tokens the clip
//            leaves alone whose cov = (A - mean A)·(sg[log_prob] - mean sg[log_prob]) (means over
//            the micro-batch's tokens) lies in (clip_cov_lb, clip_cov_ub), max(1, ⌊clip_cov_ratio ·
//            tokens⌋) drawn at random (options.generator) lose their loss and gradient;
//            clip_fraction is their share.
//   kl_cov   -A·r, r = exp(δ) unclamped, no clip; the max(1, ⌊kl_cov_ratio · tokens⌋) tokens of
//            the largest cov add ppo_kl_coef·|δ|; approx_kl is the mean of |δ| (verl's ppo_kl
//            for it).
//   Both choose their tokens within the micro-batch, as verl's, whose micro-batches rlhfd's
//   need not match (rlhfd packs them by tokens).
//   dppo_tv, dppo_kl  -A·sg[min(r, c)]·log_prob (c = clip_ratio_c; 0: no truncation) on the tokens
//            whose probability moved less than the bound in the advantage's direction: p - p_old
//            ≤ high where A > 0, ≥ -low elsewhere (tv); the binary KL of p_old to p ≤ high
//            where A > 0 or p fell, ≤ low elsewhere or p rose (kl); no gradient from the rest.
//            clip_fraction is the share left out, clip_fraction_low the kept with r > c.
//   dro      -(A·log_prob - ½·dro_beta·δ²), δ unclamped.
// `loss` is aggregated with `scale` (see AggregateLoss); the fractions and the KL are this
// micro-batch's token means (the fractions 0 where a loss clips nothing). `is_weights` (defined:
// the rollout correction's importance weights, rollout_correction.h) multiply each token's loss
// before aggregating, as verl's.
PolicyLoss ComputePolicyLoss(const at::Tensor& log_prob, const at::Tensor& old_log_prob,
                             const at::Tensor& advantages, const at::Tensor& mask,
                             const PolicyLossOptions& options,
                             const std::optional<LossScale>& scale = std::nullopt,
                             const at::Tensor& is_weights = at::Tensor());

struct ValueLoss {
  at::Tensor loss;           // scalar: 0.5 · aggregate(max((v - R)², (clip(v) - R)²))
  at::Tensor clip_fraction;  // share of tokens where the clipped term was larger
};

// Value clipping around the values the rollout was scored with: clip(v, old ± cliprange).
ValueLoss ComputeValueLoss(const at::Tensor& values, const at::Tensor& old_values,
                           const at::Tensor& returns, const at::Tensor& mask, double cliprange,
                           v1::LossAggregation aggregation,
                           const std::optional<LossScale>& scale = std::nullopt);

// Per-token KL(policy ‖ reference) estimate from log-probs (B, T):
//   k1: lp - ref;  k2: ½(lp - ref)²;  k3: exp(ref - lp) - (ref - lp) - 1, with ref - lp clamped to
//   ±20 and the result to [-10, 10] (verl's low_var_kl).
at::Tensor KlEstimate(const at::Tensor& log_prob, const at::Tensor& ref_log_prob,
                      v1::KlEstimator estimator);

}  // namespace rlhfd::train
