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

#include <map>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/transformer.h"
#include "worker/parallel/communicator.h"
#include "worker/train/optimizer.h"
#include "worker/train/trained_model.h"

namespace rlhfd::train {

class FullyShardedModel final : public TrainedModel {
 public:
  // Takes over `model`'s parameters (the same values on every rank of `group`), which must
  // outlive this object along with `group`.
  FullyShardedModel(model::Transformer model, parallel::Communicator& group, AdamWOptions options);
  ~FullyShardedModel();

  model::Transformer& module() override { return model_; }
  // Before a step's forward: gathers the root unit (embeddings, final norm, head).
  absl::Status BeginStep() override;
  // After the step's backward (each rank's loss a mean over an equal share of the batch):
  // averages the root's gradients, clips every unit's gradient shard by the global norm
  // (max_norm > 0), steps AdamW on the shards and frees the root. Returns the norm before
  // clipping.
  absl::StatusOr<double> FinishStep(double lr, double max_norm) override;
  // Frees the root unit gathered by BeginStep for forwards without a step.
  void EndForwards() override;
  void ZeroGrad() override;
  // The first failure inside forward or backward since the last call; clears it.
  absl::Status TakeStatus() override;
  int replicas() const override { return group_.size(); }
  absl::Status ReduceOverReplicas(std::vector<double>& values, ReplicaReduce op) override;
  // Layers gather their parameters inside every forward: all ranks run as many.
  bool lockstep_forwards() const override { return true; }
  // The unit whose master shard holds a NaN or an infinity on any rank ("model.layers.<k>.*").
  absl::StatusOr<std::optional<std::string>> NonFiniteParameter() override;
  // Each unit's master shard ("unit.<k>") and the AdamW state over them.
  NamedTensors StateTensors() override;
  // The pieces of the parameters in each rank's shards of the units.
  OwnedPieces Pieces() override;
  // The same by parameter: the elements [begin, end) of each parameter, flattened, that each
  // rank's shards hold (a rank holding none of it has the empty range where its neighbours meet:
  // reshard.h's train_ranges), and this rank's piece of each parameter it holds any of.
  struct PartsByParameter {
    std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> ranges;
    std::map<std::string, at::Tensor> mine;
  };
  PartsByParameter PartsOfParameters();
  // The full parameters, in the model's parameter order (an all-gather of every unit).
  absl::StatusOr<std::vector<at::Tensor>> FullParameters();

  // One unit: parameters, their shapes, and this rank's shard. Public for the layer function.
  struct Unit;

 private:
  model::Transformer model_;
  parallel::Communicator& group_;
  std::vector<std::unique_ptr<Unit>> layers_;
  std::unique_ptr<Unit> root_;
  std::unique_ptr<AdamW> optimizer_;
  absl::Status failure_;
};

}  // namespace rlhfd::train
