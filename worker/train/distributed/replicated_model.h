// ZeRO-2 as a TrainedModel: the module replicated on every rank of the data-parallel group, the
// gradients averaged into sharded float32 AdamW state (ShardedAdamW) and the updated parameters
// gathered back. A group of one trains as one process does.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "worker/parallel/communicator.h"
#include "worker/train/distributed/sharded_optimizer.h"
#include "worker/train/trained_model.h"

namespace rlhfd::train {

// All-reduces host doubles over `group` (on `device`, which the communicator works on).
absl::Status ReduceDoubles(parallel::Communicator& group, const at::Device& device,
                           std::vector<double>& values, ReplicaReduce op);

class ReplicatedModel final : public TrainedModel {
 public:
  // `module` holds the same parameters on every rank of `group`, which must outlive this.
  ReplicatedModel(model::Transformer module, parallel::Communicator& group, AdamWOptions options);

  model::Transformer& module() override { return module_; }
  absl::StatusOr<double> FinishStep(double lr, double max_norm) override;
  void ZeroGrad() override;
  int replicas() const override { return group_.size(); }
  absl::Status ReduceOverReplicas(std::vector<double>& values, ReplicaReduce op) override;
  NamedTensors StateTensors() override;

 private:
  model::Transformer module_;
  parallel::Communicator& group_;
  ShardedAdamW optimizer_;
};

}  // namespace rlhfd::train
