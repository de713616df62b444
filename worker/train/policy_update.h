// One PPO-style actor update over a rollout batch: PPO epochs over shuffled mini-batches, each an
// optimiser step accumulated over micro-batches, with the policy loss, optional KL loss and
// entropy bonus, gradient clipping, and the metrics verl reports per update.
//
// Shapes: B = sequences, T = prompt + response tokens (right-padded). Token t+1 is predicted at
// position t, so per-token tensors are (B, T-1).
#pragma once

#include <ATen/Tensor.h>

#include "worker/model/transformer.h"
#include "worker/train/losses.h"
#include "worker/train/update_loop.h"

namespace rlhfd::train {

struct PolicyUpdateBatch {
  at::Tensor input_ids;       // (B, T) int64
  at::Tensor attention_mask;  // (B, T)
  at::Tensor response_mask;   // (B, T-1): 1 where the predicted token is a response token
  at::Tensor old_log_probs;   // (B, T-1) under the rollout policy; see UpdatePolicy
  at::Tensor advantages;      // (B, T-1)
  at::Tensor ref_log_probs;   // (B, T-1), required with a KL loss
  // (B, T-1), optional: the rollout correction's weights of each token's policy loss.
  at::Tensor rollout_is_weights;
};

struct PolicyUpdateOptions {
  UpdateLoopOptions loop;  // mini-batches, micro-batches, epochs, clipping, learning rate
  PolicyLossOptions policy;
  double entropy_coeff = 0.0;
  double kl_coef = 0.0;  // KL loss weight; 0 disables it
  v1::KlEstimator kl_estimator = v1::KL_ESTIMATOR_K3;
  // The rollout's sampling temperature: log-probs and entropy are those of softmax(logits / T),
  // the distribution the responses were drawn from (verl's actor divides its logits the same).
  double temperature = 1.0;
  // Bypass mode (the old log-probs are the rollout's): report verl's rollout_corr/kl and
  // rollout_corr/k3_kl of the policy being trained against them, per optimiser step.
  bool rollout_gap_metrics = false;
  // trainer.mode sft: the loss is the response tokens' negative log-likelihood, aggregated as
  // options.policy.aggregation says (no advantages, old log-probs, KL or entropy bonus); metric
  // sft_loss in place of the policy loss's.
  bool supervised = false;
};

// Updates `model` in place. The policy loss, the entropy bonus and the KL loss aggregate as
// verl's actor does (options.policy.aggregation over each whole mini-batch), whatever the
// micro-batching. Metrics, means over optimiser steps: policy_loss and kl_loss (aggregated),
// clip_fraction(_low), approx_kl and entropy (token means), grad_norm, lr, optimizer_steps,
// response_tokens_per_s. Without old_log_probs an on-policy update (one epoch, one mini-batch of
// all rows) takes its own log-probs, detached, as the old ones (ratio 1, as verl's actor); an
// off-policy one needs them. INVALID_ARGUMENT names a batch tensor of the wrong shape or an id
// outside the vocabulary.
absl::StatusOr<UpdateMetrics> UpdatePolicy(TrainedModel& model, const PolicyUpdateBatch& batch,
                                           const PolicyUpdateOptions& options);

}  // namespace rlhfd::train
