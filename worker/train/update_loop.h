// The loop the actor and critic updates share: epochs over shuffled mini-batches, each one
// optimiser step accumulated over micro-batches, then gradient clipping and the step. With
// data-parallel replicas (TrainedModel::replicas) every replica runs it over its own rows: the
// mini-batch size is per replica, and losses and metrics are those of the global mini-batch.
#pragma once

#include <ATen/Tensor.h>

#include <functional>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "worker/model/transformer.h"
#include "worker/train/batching.h"
#include "worker/train/losses.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/trained_model.h"

namespace rlhfd::train {

// Means over the update's optimiser steps.
using UpdateMetrics = std::map<std::string, double>;

// How mini-batches become micro-batches and forwards.
struct MicroBatching {
  int64_t micro_batch = 2;                // sequences per forward/backward
  int64_t micro_batch_tokens = 0;         // > 0: instead, sequences up to this many real tokens
  bool packed = false;                    // forward packed sequences: no padding tokens computed
  bool activation_checkpointing = false;  // recompute each layer in backward
};

struct UpdateLoopOptions {
  int64_t mini_batch = 8;  // sequences per optimiser step (per replica)
  int64_t epochs = 1;
  int64_t seed = 1;
  // Rows are shuffled in runs of this many consecutive rows (the n samples of one prompt), so
  // that a micro-batch holds whole groups and computes each prompt once (PackedRows); 1, or a
  // batch that does not divide into runs: row by row.
  int64_t shuffle_group = 1;
  MicroBatching micro;
  double grad_clip = 1.0;
  double lr = 1e-6;
  // When set, optimiser step k of this update uses schedule->At(first_optimizer_step + k)
  // instead of `lr`.
  const LrSchedule* schedule = nullptr;
  int64_t first_optimizer_step = 0;
  // T of seq-mean-token-sum-norm (verl's loss_scale_factor): data.max_response_length, as verl
  // uses. 0: the longest response in the batch.
  double loss_horizon = 0;
  // What is trained ("actor", "critic"), for errors.
  std::string role = "model";
  // Optimiser steps with a non-finite loss or gradient norm that may be skipped in the whole run
  // (trainer.max_nonfinite_skips; 0: the first fails the update), and how many were before this
  // update.
  int64_t max_nonfinite_skips = 0;
  int64_t nonfinite_skips_before = 0;
};

// One micro-batch of a mini-batch.
struct MicroBatch {
  at::Tensor rows;     // int64 indices into the batch
  LossScale scale;     // the global mini-batch's loss denominators (AggregateLoss)
  double token_share;  // this micro-batch's share of the global mini-batch's response tokens
  // What the loss is multiplied by before backward: the number of replicas (FinishStep averages
  // their gradients, and each loss is a share of the global one), or 0 for a forward that only
  // keeps a lockstep layout in step (its rows are repeats and must not count in the metrics).
  double loss_weight = 1;
};

// Runs forward and backward of one micro-batch, its loss aggregated with `micro.scale` so that
// the micro-batches' losses of all replicas add up to the mini-batch's. It adds to `sums` what
// the mini-batch's metric is the sum of: aggregated losses as they are, token means weighted by
// token_share (nothing when loss_weight is 0).
using MicroStep = std::function<absl::Status(const MicroBatch& micro, UpdateMetrics& sums)>;

// response_mask (B, T-1) and attention_mask (B, T) (undefined: all tokens) size the batches.
// Returns the micro-steps' metrics (per optimiser step, averaged, summed over the replicas) plus
// grad_norm, lr, optimizer_steps, nonfinite_skips and response_tokens_per_s (this replica's). The
// first failing micro-step's or collective's status ends it; so does anything LibTorch throws
// (out of memory, say), as a status. Replicas must hold equally many rows.
//
// Non-finite values never reach the weights. Before each optimiser step every replica checks
// the metrics its micro-steps summed (the losses among them) and the replicas agree; then the
// gradient norm (FinishStep takes no step when it is not finite); after the step, the
// parameters (TrainedModel::NonFiniteParameter). A non-finite loss or gradient norm skips the
// step (gradients dropped, counted in nonfinite_skips, its metrics averaged in as they are) while
// options.max_nonfinite_skips allows, else ends the update with FAILED_PRECONDITION naming the
// optimiser step, the role and the tensor; non-finite parameters after a step always end it.
// Skipped steps still count in optimizer_steps (the learning-rate schedule's position).
absl::StatusOr<UpdateMetrics> RunUpdateLoop(TrainedModel& model, const at::Tensor& response_mask,
                                            const at::Tensor& attention_mask,
                                            const UpdateLoopOptions& options,
                                            const MicroStep& micro_step);

}  // namespace rlhfd::train
