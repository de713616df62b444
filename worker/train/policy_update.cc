// The actor update; see policy_update.h.
#include "worker/train/policy_update.h"

#include <ATen/ATen.h>

#include "worker/train/chunked_log_probs.h"

namespace rlhfd::train {

UpdateMetrics UpdatePolicy(model::Transformer& model, AdamW& optimizer,
                           const PolicyUpdateBatch& batch, const PolicyUpdateOptions& options) {
  const auto rows_of = [](const at::Tensor& t, const at::Tensor& rows) {
    return t.defined() ? t.index_select(0, rows) : t;
  };
  const MicroStep step = [&](const at::Tensor& rows, double weight, UpdateMetrics& sums) {
    const at::Tensor mask = batch.response_mask.index_select(0, rows);
    const ScoredPositions scored =
        ForwardMicroBatch(model, batch.input_ids.index_select(0, rows),
                          rows_of(batch.attention_mask, rows), options.loop.micro.packed);
    auto [flat_log_prob, flat_entropy] =
        ChunkedLogProbs(scored.hidden, model->HeadWeight(), scored.targets);
    const at::Tensor log_prob = scored.Unflatten(flat_log_prob);  // (n, T-1)
    const at::Tensor entropy = scored.Unflatten(flat_entropy);
    const PolicyLoss policy =
        ComputePolicyLoss(log_prob, batch.old_log_probs.index_select(0, rows),
                          batch.advantages.index_select(0, rows), mask, options.policy);
    at::Tensor loss = policy.loss;
    const at::Tensor mean_entropy = MaskedMean(entropy, mask);
    if (options.entropy_coeff != 0) loss = loss - options.entropy_coeff * mean_entropy;
    double kl_value = 0;
    if (options.kl_coef != 0 && batch.ref_log_probs.defined()) {
      const at::Tensor kl = MaskedMean(
          KlEstimate(log_prob, batch.ref_log_probs.index_select(0, rows), options.kl_estimator),
          mask);
      loss = loss + options.kl_coef * kl;
      kl_value = kl.item<double>();
    }
    (loss * weight).backward();
    sums["policy_loss"] += policy.loss.item<double>();
    sums["clip_fraction"] += policy.clip_fraction.item<double>();
    sums["clip_fraction_low"] += policy.clip_fraction_low.item<double>();
    sums["approx_kl"] += policy.approx_kl.item<double>();
    sums["entropy"] += mean_entropy.item<double>();
    sums["kl_loss"] += kl_value;
  };
  return RunUpdateLoop(model, optimizer, batch.response_mask, batch.attention_mask, options.loop,
                       step);
}

}  // namespace rlhfd::train
