// RL losses; see losses.h.
#include "worker/train/losses.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace rlhfd::train {

at::Tensor MaskedMean(const at::Tensor& x, const at::Tensor& mask) {
  return (x * mask).sum() / mask.sum().clamp_min(1);
}

LossScale LossScaleOf(const at::Tensor& mask, double horizon) {
  const at::Tensor per_row = mask.sum(-1);
  LossScale scale;
  scale.tokens = per_row.sum().item<double>();
  scale.sequences = per_row.gt(0).sum().item<double>();
  scale.horizon = horizon > 0 ? horizon : static_cast<double>(mask.size(-1));
  return scale;
}

at::Tensor AggregateLoss(const at::Tensor& loss, const at::Tensor& mask, v1::LossAggregation mode,
                         const std::optional<LossScale>& given) {
  const LossScale scale = given ? *given : LossScaleOf(mask);
  // Empty denominators give a zero loss rather than NaN.
  const double sequences = std::max(scale.sequences, 1.0);
  const at::Tensor masked = loss * mask;
  switch (mode) {
    case v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM:
      return masked.sum() / sequences;
    case v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN:
      // Rows without tokens have a zero sum, so clamping their count only avoids 0 / 0.
      return (masked.sum(-1) / mask.sum(-1).clamp_min(1)).sum() / sequences;
    case v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM_NORM:
      return masked.sum() / (sequences * std::max(scale.horizon, 1.0));
    case v1::LOSS_AGGREGATION_TOKEN_MEAN:
    default:
      return masked.sum() / std::max(scale.tokens, 1.0);
  }
}

namespace {

// Per-token PPO clip terms of a ratio: the unclipped and the clipped loss, and their maximum.
struct ClippedTerms {
  at::Tensor unclipped, clipped, loss;
};

ClippedTerms Clipped(const at::Tensor& ratio, const at::Tensor& advantages,
                     const PolicyLossOptions& options) {
  ClippedTerms terms{.unclipped = -advantages * ratio,
                     .clipped = -advantages * ratio.clamp(1.0 - options.clip_ratio_low,
                                                          1.0 + options.clip_ratio_high)};
  terms.loss = at::maximum(terms.unclipped, terms.clipped);
  return terms;
}

// (A - mean A)·(log_prob - mean log_prob), the means over mask's tokens: how much each token
// moves the policy's entropy, by which Clip-Cov and KL-Cov choose their tokens (arXiv 2505.22617).
at::Tensor Covariance(const at::Tensor& advantages, const at::Tensor& log_prob,
                      const at::Tensor& mask) {
  return (advantages - MaskedMean(advantages, mask)) * (log_prob - MaskedMean(log_prob, mask));
}

}  // namespace

PolicyLoss ComputePolicyLoss(const at::Tensor& log_prob, const at::Tensor& old_log_prob,
                             const at::Tensor& advantages, const at::Tensor& mask,
                             const PolicyLossOptions& options,
                             const std::optional<LossScale>& scale, const at::Tensor& is_weights) {
  const at::Tensor log_ratio = (log_prob - old_log_prob).clamp(-20.0, 20.0);
  const at::Tensor none = at::zeros({}, mask.options());
  const auto fraction = [&](const at::Tensor& where) {
    return MaskedMean(where.to(mask.scalar_type()), mask).detach();
  };
  PolicyLoss out;
  out.clip_fraction = none;
  out.clip_fraction_low = none;
  out.approx_kl = MaskedMean(-log_ratio, mask).detach();
  at::Tensor per_token;
  v1::LossAggregation aggregation = options.aggregation;
  switch (options.mode) {
    case v1::POLICY_LOSS_GSPO: {
      // verl takes the sequence's mean of the unclamped δ, and clamps only the combined log-ratio.
      const at::Tensor delta = log_prob - old_log_prob;
      const at::Tensor sequence_delta = (delta * mask).sum(-1) / mask.sum(-1).clamp_min(1);
      const at::Tensor log_sequence_ratio =
          (log_prob - log_prob.detach() + sequence_delta.detach().unsqueeze(-1)).clamp_max(10.0);
      const ClippedTerms terms = Clipped(log_sequence_ratio.exp(), advantages, options);
      per_token = terms.loss;
      out.clip_fraction = fraction(terms.clipped.gt(terms.unclipped));
      out.approx_kl = MaskedMean(-delta, mask).detach();
      break;
    }
    case v1::POLICY_LOSS_SAPO: {
      const at::Tensor tau =
          at::where(advantages.gt(0), at::full({}, options.tau_pos, advantages.options()),
                    at::full({}, options.tau_neg, advantages.options()));
      const at::Tensor gate = at::sigmoid(tau * (log_ratio.exp() - 1.0)) * (4.0 / tau);
      per_token = -gate * advantages;
      aggregation = v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN;
      break;
    }
    case v1::POLICY_LOSS_CISPO: {
      const at::Tensor ratio = log_ratio.exp();
      const at::Tensor clipped =
          ratio.clamp(1.0 - options.clip_ratio_low, 1.0 + options.clip_ratio_high).detach();
      per_token = -clipped * advantages * log_prob;
      out.clip_fraction = fraction(ratio.ne(clipped));
      break;
    }
    case v1::POLICY_LOSS_GPG:
      per_token = -log_prob * advantages;
      break;
    case v1::POLICY_LOSS_GEO_MEAN: {
      // δ unclamped, as verl's; each token's δ clipped only on the side its advantage's sign
      // makes harmful (sgn·min(sgn·δ, sgn·clip(δ))).
      const at::Tensor delta = log_prob - old_log_prob;
      const at::Tensor sign = advantages.sign();
      const at::Tensor clamped = delta.clamp(-options.clip_ratio_low, options.clip_ratio_high);
      const at::Tensor kept = sign * at::minimum(sign * delta, sign * clamped);
      const at::Tensor tokens = mask.sum(-1) + 1e-8;  // verl's denominators
      const at::Tensor ratio = ((kept * mask).sum(-1) / tokens).exp();
      at::Tensor per_sequence = -(advantages * mask).sum(-1) / tokens * ratio;
      if (is_weights.defined()) {  // their geometric mean over the sequence's tokens
        per_sequence = per_sequence * (((is_weights + 1e-10).log() * mask).sum(-1) / tokens).exp();
      }
      const LossScale denominators = scale ? *scale : LossScaleOf(mask);
      out.loss = per_sequence.sum() / std::max(denominators.sequences, 1.0);
      const at::Tensor clipped = delta.ne(clamped);
      out.clip_fraction = fraction(clipped.logical_and(advantages.gt(0)));
      out.clip_fraction_low = fraction(clipped.logical_and(advantages.lt(0)));
      out.approx_kl = MaskedMean(-delta, mask).detach();
      return out;
    }
    case v1::POLICY_LOSS_CLIP_COV: {
      const at::Tensor delta = log_prob - old_log_prob;  // unclamped, as verl's
      const ClippedTerms terms = Clipped(delta.exp(), advantages, options);
      // Drawn from the tokens the clip leaves alone, with a covariance within the bounds.
      const at::Tensor covariance = Covariance(advantages, log_prob.detach(), mask);
      const at::Tensor candidates = covariance.gt(options.clip_cov_lb)
                                        .logical_and(covariance.lt(options.clip_cov_ub))
                                        .logical_and(mask.gt(0))
                                        .logical_and(terms.clipped.le(terms.unclipped));
      at::Tensor left_out = candidates.reshape({-1}).nonzero().squeeze(1);
      const int64_t count = std::max<int64_t>(
          1, static_cast<int64_t>(options.clip_cov_ratio * mask.sum().item<double>()));
      if (left_out.numel() > count) {
        const at::Tensor draw =
            at::randperm(left_out.numel(), options.generator, at::TensorOptions().dtype(at::kLong));
        left_out = left_out.index_select(0, draw.narrow(0, 0, count).to(left_out.device()));
      }
      const at::Tensor kept =
          at::ones_like(advantages).reshape({-1}).index_fill_(0, left_out, 0).view_as(advantages);
      per_token = terms.loss * kept;
      out.clip_fraction = fraction(kept.eq(0));
      out.approx_kl = MaskedMean(-delta, mask).detach();
      break;
    }
    case v1::POLICY_LOSS_KL_COV: {
      const at::Tensor delta = log_prob - old_log_prob;  // unclamped, as verl's
      per_token = -advantages * delta.exp();
      const at::Tensor valid = mask.gt(0).reshape({-1}).nonzero().squeeze(1);
      if (valid.numel() > 0) {
        const at::Tensor covariance =
            Covariance(advantages, log_prob.detach(), mask).reshape({-1}).index_select(0, valid);
        const int64_t count = std::max<int64_t>(
            1, static_cast<int64_t>(static_cast<double>(valid.numel()) * options.kl_cov_ratio));
        const at::Tensor largest = valid.index_select(0, std::get<1>(covariance.topk(count)));
        const at::Tensor penalised = at::zeros_like(mask, at::kBool)
                                         .reshape({-1})
                                         .index_fill_(0, largest, true)
                                         .view_as(mask);
        per_token = at::where(penalised, per_token + options.ppo_kl_coef * delta.abs(), per_token);
      }
      out.approx_kl = MaskedMean(delta.abs(), mask).detach();
      break;
    }
    case v1::POLICY_LOSS_DPPO_TV:
    case v1::POLICY_LOSS_DPPO_KL: {
      const at::Tensor ratio = log_ratio.exp();
      const double c = options.clip_ratio_c;
      const at::Tensor truncated = (c > 0 ? ratio.clamp_max(c) : ratio).detach();
      const at::Tensor prob = log_prob.detach().exp(), old_prob = old_log_prob.exp();
      at::Tensor kept_if_positive, kept_if_other;
      if (options.mode == v1::POLICY_LOSS_DPPO_TV) {
        kept_if_positive = (prob - old_prob).le(options.clip_ratio_high);
        kept_if_other = (prob - old_prob).ge(-options.clip_ratio_low);
      } else {
        const at::Tensor binary_kl =
            old_prob * (old_log_prob - log_prob.detach()) +
            (1 - old_prob) * ((1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8)).log();
        kept_if_positive = binary_kl.le(options.clip_ratio_high).logical_or(prob.le(old_prob));
        kept_if_other = binary_kl.le(options.clip_ratio_low).logical_or(prob.ge(old_prob));
      }
      const at::Tensor kept =
          at::where(advantages.gt(0), kept_if_positive, kept_if_other).to(log_prob.scalar_type());
      per_token = -advantages * truncated * log_prob * kept;
      out.clip_fraction = fraction(kept.eq(0));
      if (c > 0) out.clip_fraction_low = fraction(ratio.gt(c).logical_and(kept.gt(0)));
      break;
    }
    case v1::POLICY_LOSS_DRO: {
      const at::Tensor delta = log_prob - old_log_prob;  // unclamped, as verl's
      per_token = -(log_prob * advantages - 0.5 * options.dro_beta * delta.square());
      out.approx_kl = MaskedMean(-delta, mask).detach();
      break;
    }
    case v1::POLICY_LOSS_VANILLA:
    default: {
      const ClippedTerms terms = Clipped(log_ratio.exp(), advantages, options);
      per_token = terms.loss;
      out.clip_fraction = fraction(terms.clipped.gt(terms.unclipped));
      if (options.clip_ratio_c > 0) {
        const at::Tensor dual = -advantages * options.clip_ratio_c;
        const at::Tensor negative = advantages.lt(0);
        per_token = at::where(negative, at::minimum(terms.loss, dual), terms.loss);
        out.clip_fraction_low = fraction(terms.loss.gt(dual).logical_and(negative));
      }
    }
  }
  if (is_weights.defined()) per_token = per_token * is_weights;
  out.loss = AggregateLoss(per_token, mask, aggregation, scale);
  return out;
}

ValueLoss ComputeValueLoss(const at::Tensor& values, const at::Tensor& old_values,
                           const at::Tensor& returns, const at::Tensor& mask, double cliprange,
                           v1::LossAggregation aggregation, const std::optional<LossScale>& scale) {
  const at::Tensor clipped = at::clamp(values, old_values - cliprange, old_values + cliprange);
  const at::Tensor loss_unclipped = (values - returns).pow(2);
  const at::Tensor loss_clipped = (clipped - returns).pow(2);
  ValueLoss out;
  out.loss =
      0.5 * AggregateLoss(at::maximum(loss_unclipped, loss_clipped), mask, aggregation, scale);
  out.clip_fraction =
      MaskedMean(loss_clipped.gt(loss_unclipped).to(mask.scalar_type()), mask).detach();
  return out;
}

at::Tensor KlEstimate(const at::Tensor& log_prob, const at::Tensor& ref_log_prob,
                      v1::KlEstimator estimator) {
  const at::Tensor diff = log_prob - ref_log_prob;
  switch (estimator) {
    case v1::KL_ESTIMATOR_K2:
      return 0.5 * diff.pow(2);
    case v1::KL_ESTIMATOR_K3: {
      const at::Tensor kl = (-diff).clamp(-20.0, 20.0);  // log(ref / p)
      return (kl.exp() - kl - 1).clamp(-10.0, 10.0);
    }
    case v1::KL_ESTIMATOR_K1:
    default:
      return diff;
  }
}

}  // namespace rlhfd::train
