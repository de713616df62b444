// Fully sharded data parallelism (ZeRO-3 / FSDP) for the transformer: every decoder layer is one
// unit, the embeddings, final norm and head another (the root). Between uses a rank holds only
// its flat shard of each unit (float32 masters, float64 in tests) and the model's parameter
// tensors are empty. A layer's full parameters are all-gathered right before its forward and
// freed right after; in backward they are gathered again, the layer is recomputed (so layers
// keep no activations: activation checkpointing comes with it), and its gradients are
// reduce-scattered (averaged) into the unit's shard and freed. The root unit is gathered for the
// whole step. AdamW state exists for the shards only.
//
// A communicator failure inside forward or backward (a peer lost, a timeout) never throws
// through the autograd engine: the first one is recorded, the step's result is void, and
// FinishStep (or TakeStatus, for a forward alone) returns it.
#pragma once

#include <ATen/Tensor.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/transformer.h"
#include "worker/parallel/communicator.h"
#include "worker/train/optimizer.h"

namespace rlhfd::parallel {

class FullyShardedModel {
 public:
  // Takes over `model`'s parameters (the same values on every rank of `group`), which must
  // outlive this object along with `group`.
  FullyShardedModel(model::Transformer model, Communicator& group, train::AdamWOptions options);
  ~FullyShardedModel();

  // Before a step's forward: gathers the root unit (embeddings, final norm, head).
  absl::Status BeginStep();
  // After the step's backward (each rank's loss a mean over an equal share of the batch):
  // averages the root's gradients, clips every unit's gradient shard by the global norm
  // (max_norm > 0), steps AdamW on the shards and frees the root. Returns the norm before
  // clipping.
  absl::StatusOr<double> FinishStep(double lr, double max_norm);
  // The first failure inside forward or backward since the last call; clears it.
  absl::Status TakeStatus();
  // The full parameters, in the model's parameter order (an all-gather of every unit).
  absl::StatusOr<std::vector<at::Tensor>> FullParameters();

  // One unit: parameters, their shapes, and this rank's shard. Public for the layer function.
  struct Unit;

 private:
  model::Transformer model_;
  Communicator& group_;
  std::vector<std::unique_ptr<Unit>> layers_;
  std::unique_ptr<Unit> root_;
  std::unique_ptr<train::AdamW> optimizer_;
  absl::Status failure_;
};

}  // namespace rlhfd::parallel
