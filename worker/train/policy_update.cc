// The actor update loop; see policy_update.h.
#include "worker/train/policy_update.h"

#include <ATen/ATen.h>

#include <chrono>

#include "worker/train/chunked_log_probs.h"

namespace rlhfd::train {
namespace {

at::Tensor Rows(const at::Tensor& t, const at::Tensor& index) {
  return t.defined() ? t.index_select(0, index) : t;
}

}  // namespace

UpdateMetrics UpdatePolicy(model::Transformer& model, AdamW& optimizer,
                           const PolicyUpdateBatch& batch, const PolicyUpdateOptions& options) {
  const int64_t b = batch.input_ids.size(0), t = batch.input_ids.size(1);
  const auto start = std::chrono::steady_clock::now();
  UpdateMetrics sums;
  int64_t micro_steps = 0, optimizer_steps = 0, tokens = 0;
  const at::Generator generator = at::detail::createCPUGenerator(options.seed);
  for (int64_t epoch = 0; epoch < options.epochs; ++epoch) {
    const at::Tensor order = at::randperm(b, generator, at::TensorOptions().dtype(at::kLong));
    for (int64_t mini = 0; mini < b; mini += options.mini_batch) {
      const at::Tensor mini_rows = order.narrow(0, mini, std::min(options.mini_batch, b - mini))
                                       .to(batch.input_ids.device());
      const double mini_tokens =
          batch.response_mask.index_select(0, mini_rows).sum().item<double>();
      optimizer.ZeroGrad();
      for (int64_t micro = 0; micro < mini_rows.size(0); micro += options.micro_batch) {
        const at::Tensor rows =
            mini_rows.narrow(0, micro, std::min(options.micro_batch, mini_rows.size(0) - micro));
        const at::Tensor ids = batch.input_ids.index_select(0, rows);
        const at::Tensor mask = batch.response_mask.index_select(0, rows);
        const int64_t n = ids.size(0);
        at::Tensor hidden = model->Hidden({ids, Rows(batch.attention_mask, rows)});  // (n, T, C)
        auto [log_prob, entropy] = ChunkedLogProbs(
            hidden.narrow(1, 0, t - 1).reshape({n * (t - 1), -1}), model->HeadWeight(),
            ids.narrow(1, 1, t - 1).reshape({n * (t - 1)}));
        log_prob = log_prob.view({n, t - 1});
        entropy = entropy.view({n, t - 1});
        PolicyLoss policy = ComputePolicyLoss(log_prob, batch.old_log_probs.index_select(0, rows),
                                              batch.advantages.index_select(0, rows), mask,
                                              options.policy);
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
        // Token-mean over the mini-batch = Σ over micro-batches of (their token share) x mean.
        const double micro_tokens = mask.sum().item<double>();
        (loss * (micro_tokens / std::max(mini_tokens, 1.0))).backward();
        sums["policy_loss"] += policy.loss.item<double>();
        sums["clip_fraction"] += policy.clip_fraction.item<double>();
        sums["clip_fraction_low"] += policy.clip_fraction_low.item<double>();
        sums["approx_kl"] += policy.approx_kl.item<double>();
        sums["entropy"] += mean_entropy.item<double>();
        sums["kl_loss"] += kl_value;
        tokens += static_cast<int64_t>(micro_tokens);
        ++micro_steps;
      }
      sums["grad_norm"] += optimizer.ClipGradNorm(options.grad_clip);
      optimizer.Step(options.lr);
      ++optimizer_steps;
    }
  }
  UpdateMetrics metrics;
  for (const auto& [name, value] : sums) {
    metrics[name] = value / (name == "grad_norm" ? optimizer_steps : micro_steps);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  metrics["lr"] = options.lr;
  metrics["optimizer_steps"] = static_cast<double>(optimizer_steps);
  metrics["response_tokens_per_s"] = tokens / std::max(seconds, 1e-9);
  return metrics;
}

}  // namespace rlhfd::train
