// What the updates train: a module, how one mini-batch's gradients become a step, and the
// data-parallel replicas it is one of. One interface for every training layout: LocalModel here
// (one process), ReplicatedModel (ZeRO-2) and FullyShardedModel (ZeRO-3) in
// worker/train/distributed.
//
// Data parallelism: every replica runs the same number of mini-batches, each over its own rows;
// the update loop sums each mini-batch's loss denominators over the replicas, so every replica's
// loss is its share of the global mini-batch's loss, and FinishStep sums the replicas' gradients.
// A collective that fails (a peer lost, a timeout) is a Status, never an exception.
#pragma once

#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model/lora.h"
#include "worker/model/transformer.h"
#include "worker/train/optimizer.h"

namespace rlhfd::train {

enum class ReplicaReduce { kSum, kMax };

class TrainedModel {
 public:
  virtual ~TrainedModel() = default;

  // The module forwards run through.
  virtual model::Transformer& module() = 0;
  // Before a mini-batch's first forward, or a run of forwards without a step.
  virtual absl::Status BeginStep() { return absl::OkStatus(); }
  // After a run of forwards that ends without a step (log-probs, values).
  virtual void EndForwards() {}
  // After its last backward: the gradients summed over the replicas, clipped by their global
  // norm (max_norm > 0), one AdamW step with `lr`. Returns the norm before clipping; on an error
  // the gradients are dropped and the parameters are unchanged. A norm that is not finite (NaN
  // or infinite gradients anywhere) takes no step: the gradients are dropped and the parameters
  // and optimiser state stay as they were (every replica sees the same norm, so all skip).
  virtual absl::StatusOr<double> FinishStep(double lr, double max_norm) = 0;
  virtual void ZeroGrad() = 0;
  // The first collective failure inside a forward or backward since the last call; clears it.
  virtual absl::Status TakeStatus() { return absl::OkStatus(); }

  // Data-parallel replicas training together (1: this one alone).
  virtual int replicas() const { return 1; }
  // Reduces `values` over the replicas in place (every replica calls it with as many values).
  virtual absl::Status ReduceOverReplicas(std::vector<double>& values, ReplicaReduce op) {
    return absl::OkStatus();
  }
  // Whether every replica must run the same number of forwards (the layout gathers parameters
  // inside them): the loop then pads short replicas with forwards that count nothing.
  virtual bool lockstep_forwards() const { return false; }

  // After a step: the name of a parameter that holds a NaN or an infinity, or none; every replica
  // gets the same answer. One fused reduction over the parameters (finite_check.h). This default
  // reads module()'s parameters, which every replica holds whole and equal.
  virtual absl::StatusOr<std::optional<std::string>> NonFiniteParameter();
  // After a FinishStep whose norm was not finite: the parameter (or layer) nearest the output
  // whose gradient this rank found non-finite, where the backward went wrong (a NaN spreads to
  // every earlier parameter), for the error; "" when the layout does not tell (a replicated
  // optimiser flattens them) or none was.
  const std::string& nonfinite_gradient() const { return nonfinite_gradient_; }

  // Everything this rank's training state is, as tensors that alias it (parameters or their
  // shards, optimiser moments, step counts), by name: a checkpoint writes them and a load copies
  // into them, which restores training bitwise.
  using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;
  virtual NamedTensors StateTensors() = 0;

  // Which rank holds which part of the trained weights as its source of truth (what the
  // rollout's weights are checked against): every replica every parameter whole where each holds
  // the module (this default; a LoRA model's merged weights, which the rollout runs), each rank
  // the pieces in its shards under ZeRO-3.
  struct PieceSpan {
    std::string name;    // a parameter
    int64_t offset = 0;  // its elements [offset, offset + count), flattened
    int64_t count = 0;
  };
  struct OwnedPieces {
    std::vector<std::vector<PieceSpan>> layout;  // every replica's pieces, by rank
    std::vector<at::Tensor> values;              // this rank's pieces (its layout's order), flat
  };
  virtual OwnedPieces Pieces();

 protected:
  std::string nonfinite_gradient_;
};

// The module's trained parameters by name (a LoRA model's adapters: its frozen base is the model
// directory's), then `optimizer`'s state under "optimizer.".
TrainedModel::NamedTensors ModuleAndOptimizerState(model::Transformer& module,
                                                   const AdamW& optimizer);

// The name of `module`'s parameter nearest the output whose gradient holds a NaN or an infinity
// ("" if none): where the backward went non-finite, since it spreads to every earlier parameter.
std::string NonFiniteGradientOrigin(model::Transformer& module);

// One process: the module and AdamW over its parameters.
class LocalModel final : public TrainedModel {
 public:
  LocalModel(model::Transformer module, AdamWOptions options)
      : module_(std::move(module)), optimizer_(model::TrainableParameters(module_), options) {}

  model::Transformer& module() override { return module_; }
  absl::StatusOr<double> FinishStep(double lr, double max_norm) override {
    const double norm = optimizer_.ClipGradNorm(max_norm);
    nonfinite_gradient_.clear();
    if (std::isfinite(norm)) {
      optimizer_.Step(lr);
    } else {
      nonfinite_gradient_ = NonFiniteGradientOrigin(module_);
      optimizer_.ZeroGrad();
    }
    return norm;
  }
  void ZeroGrad() override { optimizer_.ZeroGrad(); }
  NamedTensors StateTensors() override { return ModuleAndOptimizerState(module_, optimizer_); }
  AdamW& optimizer() { return optimizer_; }

 private:
  model::Transformer module_;
  AdamW optimizer_;
};

}  // namespace rlhfd::train
