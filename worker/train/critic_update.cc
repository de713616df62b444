// The critic update; see critic_update.h.
#include "worker/train/critic_update.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "worker/train/batch_checks.h"
#include "worker/train/losses.h"

namespace rlhfd::train {

ExplainedVarianceSums ExplainedVarianceSumsOf(const at::Tensor& values, const at::Tensor& returns,
                                              const at::Tensor& mask) {
  const at::Tensor keep = mask.to(at::kBool);
  const at::Tensor r = returns.masked_select(keep).to(at::kDouble);
  const at::Tensor e = r - values.masked_select(keep).to(at::kDouble);
  return {.count = static_cast<double>(r.numel()),
          .returns = r.sum().item<double>(),
          .returns_squared = r.pow(2).sum().item<double>(),
          .errors = e.sum().item<double>(),
          .errors_squared = e.pow(2).sum().item<double>()};
}

double ExplainedVarianceFrom(const ExplainedVarianceSums& sums) {
  if (sums.count == 0) return 0.0;
  const double mean_returns = sums.returns / sums.count;
  const double variance = sums.returns_squared / sums.count - mean_returns * mean_returns;
  if (variance <= 0) return 0.0;
  const double mean_errors = sums.errors / sums.count;
  return 1.0 - (sums.errors_squared / sums.count - mean_errors * mean_errors) / variance;
}

double ExplainedVariance(const at::Tensor& values, const at::Tensor& returns,
                         const at::Tensor& mask) {
  return ExplainedVarianceFrom(ExplainedVarianceSumsOf(values, returns, mask));
}

absl::StatusOr<UpdateMetrics> UpdateCritic(TrainedModel& trained, const CriticUpdateBatch& batch,
                                           const CriticUpdateOptions& options) {
  model::Transformer& model = trained.module();
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
        {.packed = options.loop.micro.packed, .scored = mask});
    const at::Tensor values = scored.Unflatten(model->Scores(scored.hidden).squeeze(-1));
    const ValueLoss loss = ComputeValueLoss(values, batch.old_values.index_select(0, rows),
                                            batch.returns.index_select(0, rows), mask,
                                            options.value_clip, options.aggregation,
                                            micro.scale);
    (loss.loss * micro.loss_weight).backward();
    if (micro.loss_weight == 0) return absl::OkStatus();  // a lockstep repeat: counts nothing
    sums["value_loss"] += loss.loss.item<double>();
    sums["value_clip_fraction"] += loss.clip_fraction.item<double>() * micro.token_share;
    sums["values"] += MaskedMean(values.detach(), mask).item<double>() * micro.token_share;
    predicted.index_copy_(0, rows, values.detach().to(predicted.scalar_type()));
    seen.index_copy_(0, rows, mask.to(at::kBool));
    return absl::OkStatus();
  };
  ASSIGN_OR_RETURN(UpdateMetrics metrics,
                   RunUpdateLoop(trained, batch.response_mask, batch.attention_mask, options.loop,
                                 step));
  const ExplainedVarianceSums local = ExplainedVarianceSumsOf(predicted, batch.returns, seen);
  std::vector<double> sums = {local.count, local.returns, local.returns_squared, local.errors,
                              local.errors_squared};
  RETURN_IF_ERROR(trained.ReduceOverReplicas(sums, ReplicaReduce::kSum));
  metrics["explained_variance"] =
      ExplainedVarianceFrom({sums[0], sums[1], sums[2], sums[3], sums[4]});
  return metrics;
}

}  // namespace rlhfd::train
