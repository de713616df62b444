// The critic update; see critic_update.h.
#include "worker/train/critic_update.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "worker/train/batch_checks.h"
#include "worker/train/losses.h"

namespace rlhfd::train {

double ExplainedVariance(const at::Tensor& values, const at::Tensor& returns,
                         const at::Tensor& mask) {
  const at::Tensor keep = mask.to(at::kBool);
  const at::Tensor r = returns.masked_select(keep).to(at::kDouble);
  const at::Tensor v = values.masked_select(keep).to(at::kDouble);
  if (r.numel() == 0) return 0.0;
  const double variance = (r - r.mean()).pow(2).mean().item<double>();
  if (variance == 0) return 0.0;
  const at::Tensor error = r - v;
  return 1.0 - (error - error.mean()).pow(2).mean().item<double>() / variance;
}

absl::StatusOr<UpdateMetrics> UpdateCritic(model::Transformer& model, AdamW& optimizer,
                                           const CriticUpdateBatch& batch,
                                           const CriticUpdateOptions& options) {
  if (model->config().head == model::HeadKind::kCausalLm || model->config().num_labels != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the critic update needs a model with a one-label score head, not ",
        model->config().architecture, " with num_labels ", model->config().num_labels));
  }
  BatchChecker check("critic update", batch.input_ids, model->config().vocab_size);
  check.Mask("attention_mask", batch.attention_mask);
  check.PerToken("response_mask", batch.response_mask);
  check.PerToken("old_values", batch.old_values);
  check.PerToken("returns", batch.returns);
  RETURN_IF_ERROR(check.status());
  // Values as computed (before each step), for the explained variance over the whole update.
  at::Tensor predicted = at::zeros_like(batch.returns);
  at::Tensor seen = at::zeros_like(batch.response_mask, at::kBool);
  const MicroStep step = [&](const MicroBatch& micro, UpdateMetrics& sums) -> absl::Status {
    const at::Tensor& rows = micro.rows;
    const at::Tensor mask = batch.response_mask.index_select(0, rows);
    const ScoredPositions scored = ForwardMicroBatch(
        model, batch.input_ids.index_select(0, rows),
        batch.attention_mask.defined() ? batch.attention_mask.index_select(0, rows) : at::Tensor(),
        options.loop.micro.packed);
    const at::Tensor values = scored.Unflatten(model->Scores(scored.hidden).squeeze(-1));
    const ValueLoss loss = ComputeValueLoss(values, batch.old_values.index_select(0, rows),
                                            batch.returns.index_select(0, rows), mask,
                                            options.value_clip, options.aggregation,
                                            micro.scale);
    loss.loss.backward();
    sums["value_loss"] += loss.loss.item<double>();
    sums["value_clip_fraction"] += loss.clip_fraction.item<double>() * micro.token_share;
    sums["values"] += MaskedMean(values.detach(), mask).item<double>() * micro.token_share;
    predicted.index_copy_(0, rows, values.detach().to(predicted.scalar_type()));
    seen.index_copy_(0, rows, mask.to(at::kBool));
    return absl::OkStatus();
  };
  ASSIGN_OR_RETURN(UpdateMetrics metrics,
                   RunUpdateLoop(model, optimizer, batch.response_mask, batch.attention_mask,
                                 options.loop, step));
  metrics["explained_variance"] = ExplainedVariance(predicted, batch.returns, seen);
  return metrics;
}

}  // namespace rlhfd::train
