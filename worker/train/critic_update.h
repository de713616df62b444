// One critic (value model) update over a rollout batch: the value loss with value clipping,
// optimised like the actor (epochs, mini- and micro-batches, clipping), with verl's metrics.
//
// Shapes as in policy_update.h: the value at position p estimates the return from the token at
// p + 1 on, so per-token tensors are (B, T-1).
#pragma once

#include <ATen/Tensor.h>

#include "rlhfd/v1/job_spec.pb.h"
#include "worker/model/transformer.h"
#include "worker/train/update_loop.h"

namespace rlhfd::train {

struct CriticUpdateBatch {
  at::Tensor input_ids;       // (B, T) int64
  at::Tensor attention_mask;  // (B, T)
  at::Tensor response_mask;   // (B, T-1)
  at::Tensor old_values;      // (B, T-1): the values the rollout was scored with
  at::Tensor returns;         // (B, T-1): GAE returns
};

struct CriticUpdateOptions {
  UpdateLoopOptions loop;
  double value_clip = 0.5;  // cliprange_value
  v1::LossAggregation aggregation = v1::LOSS_AGGREGATION_TOKEN_MEAN;
};

// 1 - Var(returns - values) / Var(returns) over the masked tokens: 1 when the values predict the
// returns exactly, 0 when they do no better than the returns' mean. 0 when the returns are
// constant.
double ExplainedVariance(const at::Tensor& values, const at::Tensor& returns,
                         const at::Tensor& mask);

// The sums it is computed from (masked tokens), which add up over data-parallel replicas.
struct ExplainedVarianceSums {
  double count = 0, returns = 0, returns_squared = 0, errors = 0, errors_squared = 0;
};
ExplainedVarianceSums ExplainedVarianceSumsOf(const at::Tensor& values, const at::Tensor& returns,
                                              const at::Tensor& mask);
double ExplainedVarianceFrom(const ExplainedVarianceSums& sums);

// Updates a score-head model (one label) in place. Metrics: value_loss, value_clip_fraction,
// values (mean), explained_variance (of the values the micro-batches computed, before their
// step; the last epoch's; over all replicas), grad_norm, lr, optimizer_steps, response_tokens_per_s.
// INVALID_ARGUMENT for a model without a one-label score head or a batch of the wrong shape.
absl::StatusOr<UpdateMetrics> UpdateCritic(TrainedModel& model, const CriticUpdateBatch& batch,
                                           const CriticUpdateOptions& options);

}  // namespace rlhfd::train
