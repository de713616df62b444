// The actor update; see policy_update.h.
#include "worker/train/policy_update.h"

#include <ATen/ATen.h>

#include "common/status/status_macros.h"
#include "worker/train/batch_checks.h"
#include "worker/train/chunked_log_probs.h"

namespace rlhfd::train {

absl::StatusOr<UpdateMetrics> UpdatePolicy(TrainedModel& trained, const PolicyUpdateBatch& batch,
                                           const PolicyUpdateOptions& options) {
  model::Transformer& model = trained.module();
  if (model->config().head != model::HeadKind::kCausalLm) {
    return absl::InvalidArgumentError("the actor update needs a causal-LM model");
  }
  BatchChecker check("actor update", batch.input_ids, model->config().vocab_size);
  check.Mask("attention_mask", batch.attention_mask);
  check.PerToken("response_mask", batch.response_mask);
  const bool on_policy =
      options.loop.epochs == 1 && options.loop.mini_batch >= batch.input_ids.size(0);
  check.PerToken("old_log_probs", batch.old_log_probs,
                 /*required=*/!on_policy && !options.supervised);
  check.PerToken("advantages", batch.advantages, /*required=*/!options.supervised);
  check.PerToken("ref_log_probs", batch.ref_log_probs, /*required=*/options.kl_coef != 0);
  check.PerToken("rollout_is_weights", batch.rollout_is_weights, /*required=*/false);
  RETURN_IF_ERROR(check.status());
  const auto rows_of = [](const at::Tensor& t, const at::Tensor& rows) {
    return t.defined() ? t.index_select(0, rows) : t;
  };
  const v1::LossAggregation mode = options.policy.aggregation;
  const MicroStep step = [&](const MicroBatch& micro, UpdateMetrics& sums) -> absl::Status {
    const at::Tensor& rows = micro.rows;
    const at::Tensor mask = batch.response_mask.index_select(0, rows);
    // Only the positions the losses read are scored (not the prompt's).
    const ScoredPositions scored = ForwardMicroBatch(
        model, batch.input_ids.index_select(0, rows), rows_of(batch.attention_mask, rows),
        {.packed = options.loop.micro.packed, .scored = mask});
    auto [flat_log_prob, flat_entropy] = ChunkedLogProbs(
        TemperatureScaled(scored.hidden, options.temperature), model->HeadWeight(), scored.targets);
    const at::Tensor log_prob = scored.Unflatten(flat_log_prob);  // (n, T-1)
    const at::Tensor entropy = scored.Unflatten(flat_entropy);
    if (options.supervised) {
      const at::Tensor nll = AggregateLoss(-log_prob, mask, mode, micro.scale);
      (nll * micro.loss_weight).backward();
      if (micro.loss_weight == 0) return absl::OkStatus();  // a lockstep repeat: counts nothing
      sums["sft_loss"] += nll.item<double>();
      sums["entropy"] += MaskedMean(entropy, mask).item<double>() * micro.token_share;
      return absl::OkStatus();
    }
    const at::Tensor old_log_prob = batch.old_log_probs.defined()
                                        ? batch.old_log_probs.index_select(0, rows)
                                        : log_prob.detach();
    const PolicyLoss policy =
        ComputePolicyLoss(log_prob, old_log_prob, batch.advantages.index_select(0, rows), mask,
                          options.policy, micro.scale, rows_of(batch.rollout_is_weights, rows));
    // As verl's actor: the entropy bonus and the KL loss aggregate like the policy loss.
    at::Tensor loss = policy.loss;
    if (options.entropy_coeff != 0) {
      loss = loss - options.entropy_coeff * AggregateLoss(entropy, mask, mode, micro.scale);
    }
    at::Tensor kl;
    if (options.kl_coef != 0) {
      kl = AggregateLoss(
          KlEstimate(log_prob, batch.ref_log_probs.index_select(0, rows), options.kl_estimator),
          mask, mode, micro.scale);
      loss = loss + options.kl_coef * kl;
    }
    (loss * micro.loss_weight).backward();
    if (micro.loss_weight == 0) return absl::OkStatus();  // a lockstep repeat: counts nothing
    sums["kl_loss"] += kl.defined() ? kl.item<double>() : 0.0;
    sums["policy_loss"] += policy.loss.item<double>();
    sums["clip_fraction"] += policy.clip_fraction.item<double>() * micro.token_share;
    sums["clip_fraction_low"] += policy.clip_fraction_low.item<double>() * micro.token_share;
    sums["approx_kl"] += policy.approx_kl.item<double>() * micro.token_share;
    if (options.rollout_gap_metrics) {
      // As verl's bypass loss: kl = mean(rollout - current), k3 = mean(exp(d) - d - 1) with
      // d = current - rollout.
      const at::Tensor gap = log_prob.detach() - old_log_prob;
      sums["rollout_corr/kl"] += MaskedMean(-gap, mask).item<double>() * micro.token_share;
      sums["rollout_corr/k3_kl"] +=
          MaskedMean(gap.exp() - gap - 1, mask).item<double>() * micro.token_share;
    }
    sums["entropy"] += MaskedMean(entropy, mask).item<double>() * micro.token_share;
    return absl::OkStatus();
  };
  return RunUpdateLoop(trained, batch.response_mask, batch.attention_mask, options.loop, step);
}

}  // namespace rlhfd::train
