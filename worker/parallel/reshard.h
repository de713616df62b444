// Resharding actor weights from the training layout to the rollout layout (HybridFlow's
// 3D-HybridEngine), with zero redundancy: every rank receives only its own rollout slice, and
// every piece of it comes straight from the training shard that holds it.
//
// Training layout over W = dp · tp ranks (rank = d · tp + t): each parameter is split along its
// tensor-parallel dim into tp pieces (Megatron's column / row parallel; replicated parameters are
// whole), and piece t is flattened, padded to a multiple of dp and cut into dp contiguous shards,
// shard d living on rank (d, t) — FSDP's flat shards inside each tensor-parallel rank.
// Rollout layout over the same W = tp_g · dp_g ranks (rank = k · tp_g + j): rank (j, k) needs
// piece j of each parameter split tp_g ways along the same dim.
#pragma once

#include <ATen/Tensor.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/parallel/communicator.h"

namespace rlhfd::parallel {

struct ShardedParameter {
  std::string name;
  std::vector<int64_t> shape;  // 1-D or 2-D
  int tp_dim = -1;             // 0: column / vocab parallel, 1: row parallel, -1: replicated
};

struct TrainLayout {
  int dp = 1;
  int tp = 1;
};

struct RolloutLayout {
  int tp = 1;
  int dp = 1;
};

// This rank's training shard of `full` (flat, padded with zeros) and its rollout slice, sliced
// directly from the full tensor: how shards are made at load time, and the tests' reference.
// TrainShardNumel is the shard's length without building it.
int64_t TrainShardNumel(const ShardedParameter& parameter, const TrainLayout& layout);
at::Tensor TrainShard(const at::Tensor& full, const ShardedParameter& parameter,
                      const TrainLayout& layout, int rank);
at::Tensor RolloutSlice(const at::Tensor& full, const ShardedParameter& parameter,
                        const RolloutLayout& layout, int rank);

// What one Reshard call moved for this rank, in elements.
struct ReshardStats {
  int64_t sent = 0;
  int64_t received = 0;
  int64_t local = 0;  // Copied from this rank's own shard.
};

// Gathers this rank's rollout slice of every parameter (a bucket: call it layer by layer) from the
// training shards of all ranks, in one grouped send/recv. `train_shards[i]` is this rank's shard
// of parameters[i]. Every rank of `world` (the actor pool) calls it with the same parameters.
// Plans are range arithmetic: a shard is at most three rectangles of its tensor-parallel piece,
// clipped to each destination's slice, so planning costs nothing per element.
absl::StatusOr<std::vector<at::Tensor>> Reshard(Communicator& world,
                                                const std::vector<ShardedParameter>& parameters,
                                                const std::vector<at::Tensor>& train_shards,
                                                const TrainLayout& train,
                                                const RolloutLayout& rollout,
                                                ReshardStats* stats = nullptr);

}  // namespace rlhfd::parallel
