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

struct ReshardOptions {
  // Work is cut into buckets (whole parameters, or row ranges of large ones) whose packed send
  // and receive buffers take at most this many bytes on any rank: the reshard's transient
  // memory beyond the rollout copy. Buckets are queued back to back without host waits.
  int64_t bucket_bytes = int64_t{256} << 20;
};

// What one Reshard call moved for this rank.
struct ReshardStats {
  int64_t sent_bytes = 0;
  int64_t received_bytes = 0;
  int64_t local_bytes = 0;  // Copied from this rank's own shard.
  int64_t buckets = 0;
};

// Gathers this rank's rollout slice of every parameter from the training shards of all ranks.
// `train_shards[i]` is this rank's shard of parameters[i]; every rank of `world` (the actor
// pool) calls it with the same parameters, dtypes and options. Per bucket: one kernel packs the
// blocks each peer needs into one message per peer (and copies the local blocks), one grouped
// send/recv moves the messages, one kernel unpacks them into the slices. Plans are range
// arithmetic: a shard is at most three rectangles of its tensor-parallel piece, clipped to each
// destination's slice, so planning costs nothing per element. The slices share one allocation
// (the rollout copy); the call returns when they are complete.
absl::StatusOr<std::vector<at::Tensor>> Reshard(Communicator& world,
                                                const std::vector<ShardedParameter>& parameters,
                                                const std::vector<at::Tensor>& train_shards,
                                                const TrainLayout& train,
                                                const RolloutLayout& rollout,
                                                const ReshardOptions& options = {},
                                                ReshardStats* stats = nullptr);

}  // namespace rlhfd::parallel
