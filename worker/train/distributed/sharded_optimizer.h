// ZeRO-2 data parallelism: every rank of the data-parallel group keeps the full parameters (for
// small models), gradients are averaged over the group with a reduce-scatter into flat shards,
// and each rank keeps float32 (float64 in tests) master weights and AdamW state for its shard
// only, steps them, and all-gathers the updated shards back into the parameters. Optimizer
// memory falls by the group size; the full gradients are freed as soon as they are scattered.
#pragma once

#include <ATen/Tensor.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/parallel/communicator.h"
#include "worker/train/optimizer.h"

namespace rlhfd::train {

class ShardedAdamW {
 public:
  // `params`: the module's parameters, the same shapes and order on every rank; `group`: the
  // data-parallel group (it must outlive this object).
  ShardedAdamW(std::vector<at::Tensor> params, parallel::Communicator& group, AdamWOptions options);

  // After each rank's backward (its loss a mean over an equal share of the batch): averages the
  // gradients, clips them by their global norm (max_norm > 0), updates and redistributes the
  // parameters. Returns the gradient norm before clipping; when it is not finite, nothing is
  // updated (the gradients are dropped).
  absl::StatusOr<double> Step(double lr, double max_norm);

  int64_t shard_size() const { return shard_size_; }
  // This rank's master shard ("master") and its AdamW state, aliased (checkpoints).
  std::vector<std::pair<std::string, at::Tensor>> State() const;

 private:
  std::vector<at::Tensor> params_;
  parallel::Communicator& group_;
  int64_t total_ = 0, shard_size_ = 0;
  at::Tensor master_;  // This rank's shard of the flattened parameters (padded), wide dtype.
  std::unique_ptr<AdamW> optimizer_;
};

}  // namespace rlhfd::train
