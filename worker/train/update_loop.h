// The loop the actor and critic updates share: epochs over shuffled mini-batches, each one
// optimiser step accumulated over micro-batches, then gradient clipping and the step.
#pragma once

#include <ATen/Tensor.h>

#include <functional>
#include <map>
#include <string>

#include "worker/model/transformer.h"
#include "worker/train/batching.h"
#include "worker/train/optimizer.h"

namespace rlhfd::train {

// Means over the update's micro-batches (grad_norm over optimiser steps).
using UpdateMetrics = std::map<std::string, double>;

// How mini-batches become micro-batches and forwards.
struct MicroBatching {
  int64_t micro_batch = 2;                // sequences per forward/backward
  int64_t micro_batch_tokens = 0;         // > 0: instead, sequences up to this many real tokens
  bool packed = false;                    // forward packed sequences: no padding tokens computed
  bool activation_checkpointing = false;  // recompute each layer in backward
};

struct UpdateLoopOptions {
  int64_t mini_batch = 8;  // sequences per optimiser step
  int64_t epochs = 1;
  int64_t seed = 1;
  MicroBatching micro;
  double grad_clip = 1.0;
  double lr = 1e-6;
};

// One micro-batch: the rows (int64 indices into the batch) and the weight its loss gets (its
// share of the mini-batch's response tokens, which makes token-mean losses exact across
// micro-batches). It runs forward and backward and adds its metrics to `sums`.
using MicroStep = std::function<void(const at::Tensor& rows, double weight, UpdateMetrics& sums)>;

// response_mask (B, T-1) and attention_mask (B, T) (undefined: all tokens) size the batches.
// Returns the micro-step metrics' means plus grad_norm, lr, optimizer_steps and
// response_tokens_per_s.
UpdateMetrics RunUpdateLoop(model::Transformer& model, AdamW& optimizer,
                            const at::Tensor& response_mask, const at::Tensor& attention_mask,
                            const UpdateLoopOptions& options, const MicroStep& micro_step);

}  // namespace rlhfd::train
