// Resharding actor weights from the training layout to the rollout layout (HybridFlow's
// 3D-HybridEngine), with zero redundancy: every rank receives only its own rollout slice, and
// every piece of it comes straight from the training shard that holds it.
//
// Training layout over W = dp · tp ranks (rank = d · tp + t): each parameter is split along its
// tensor-parallel dim into tp pieces (Megatron's column / row parallel; replicated parameters are
// whole), and piece t is flattened, padded to a multiple of dp and cut into dp contiguous shards,
// shard d living on rank (d, t) — FSDP's flat shards inside each tensor-parallel rank.
// Rollout layout over W' = tp_g · dp_g ranks (rank = k · tp_g + j): rank (j, k) needs piece j of
// each parameter split tp_g ways along the same dim. By default both layouts number the same
// ranks of the communicator (the hybrid engine: the actor's ranks train and generate); a rollout
// pool of its own receives on other ranks of a communicator spanning both pools
// (ReshardOptions::train_ranks / rollout_ranks).
#pragma once

#include <ATen/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/parallel/block_copy.h"
#include "worker/parallel/communicator.h"

namespace rlhfd::parallel {

struct ShardedParameter {
  std::string name;
  std::vector<int64_t> shape;  // 1-D or 2-D
  int tp_dim = -1;             // 0: column / vocab parallel, 1: row parallel, -1: replicated
  // Training tp 1 only: when not empty, the elements [first, second) of the flattened parameter
  // that training rank d holds, in place of the even split (ZeRO-3's units shard their
  // parameters concatenated, so a parameter's pieces are uneven and some empty). The ranges
  // partition the parameter.
  std::vector<std::pair<int64_t, int64_t>> train_ranges;
};

// The two layouts name their sizes in opposite orders (verl's dp × tp for training, tp_g × dp_g
// for the rollout): build them with designated initializers ({.dp = ..., .tp = ...}), never by
// position.
struct TrainLayout {
  int dp = 1;
  int tp = 1;
};

struct RolloutLayout {
  int tp = 1;
  int dp = 1;
};

// This rank's training shard of `full` (flat, padded with zeros; or its train_ranges' elements)
// and its rollout slice, sliced directly from the full tensor: how shards are made at load time,
// and the tests' reference. TrainShardNumel is rank `rank`'s shard's length without building it.
int64_t TrainShardNumel(const ShardedParameter& parameter, const TrainLayout& layout, int rank);
at::Tensor TrainShard(const at::Tensor& full, const ShardedParameter& parameter,
                      const TrainLayout& layout, int rank);
at::Tensor RolloutSlice(const at::Tensor& full, const ShardedParameter& parameter,
                        const RolloutLayout& layout, int rank);

struct ReshardOptions {
  // Work is cut into buckets (parameters, and row ranges of large ones) whose packed send and
  // receive buffers take at most this many bytes on any rank: the reshard's transient memory
  // beyond the rollout copy. Larger buckets mean fewer, longer transfers.
  int64_t bucket_bytes = int64_t{1} << 30;
  // The communicator ranks holding training rank 0, 1, ... and rollout rank 0, 1, ...; empty:
  // ranks 0 .. W - 1 for each. A rank may be in both lists (at the same place or not), in one,
  // or in neither (it only takes part in the plan's agreement). Every rank passes the same lists.
  std::vector<int> train_ranks;
  std::vector<int> rollout_ranks;
};

// What a reshard moves for this rank.
struct ReshardStats {
  int64_t sent_bytes = 0;
  int64_t received_bytes = 0;
  int64_t local_bytes = 0;   // Copied from this rank's own shard.
  int64_t shared_bytes = 0;  // Slices that are views of this rank's shard: nothing copied.
  int64_t buckets = 0;
  int64_t buffer_bytes = 0;  // The send and receive buffers (the transient memory).
};

// Where one run's host time went, in seconds from its start (for benchmarks).
struct ReshardTiming {
  double first_pack_queued = 0;      // Checks, allocations and the first pack kernel queued.
  double first_transfer_queued = 0;  // Its send/recv queued (the local copies and views meanwhile).
  double all_queued = 0;             // Every bucket queued.
  double done = 0;                   // The device finished.
};

// How weights move from the training layout to the rollout layout, planned once per model and
// pair of layouts and run every time they move (each RL step). Planning is range arithmetic: a
// shard is at most three rectangles of its tensor-parallel piece, clipped to each destination's
// slice, so it costs nothing per element; the ranks agree on the buckets with one all-reduce.
// A run allocates the rollout copy (the slices in one allocation; a slice that is one run of this
// rank's own shard is a view of it instead, as the layouts coincide there: the rollout copy must
// then be dropped before training changes the shards, as it must be anyway), copies the local
// blocks in one kernel on a side stream, and per bucket: one kernel packs the blocks each peer
// needs into one message per peer, one grouped send/recv moves the messages, one kernel unpacks
// them. The buckets are queued back to back; the host waits once, at the end.
class ReshardPlan {
 public:
  // Every rank of `world` (the actor pool, or the actor and rollout pools) calls it with the same
  // parameters (train_ranges included: a rank that trains nothing is told them), dtypes, layouts
  // and options; `device` is where the shards live.
  static absl::StatusOr<ReshardPlan> Create(Communicator& world,
                                            const std::vector<ShardedParameter>& parameters,
                                            const std::vector<at::ScalarType>& dtypes,
                                            const TrainLayout& train, const RolloutLayout& rollout,
                                            const at::Device& device,
                                            const ReshardOptions& options = {});

  // This rank's rollout slice of every parameter (none on a rank that is no rollout rank);
  // `train_shards[i]` is this rank's shard of parameters[i] (none on a rank that is no training
  // rank). Every rank of `world` calls it. Returns when the slices are complete. One run of a
  // plan at a time.
  absl::StatusOr<std::vector<at::Tensor>> Run(Communicator& world,
                                              const std::vector<at::Tensor>& train_shards,
                                              ReshardTiming* timing = nullptr) const;

  const ReshardStats& stats() const { return stats_; }

 private:
  struct Launch {
    int64_t begin = 0, end = 0, tiles = 0;  // Copies [begin, end) of copies_.
  };
  struct Bucket {
    Launch pack, unpack;
    std::vector<int64_t> send_bytes, receive_bytes;  // Per peer.
    int64_t send_total = 0;                          // Where the incoming messages start.
  };

  ReshardPlan() = default;

  std::vector<ShardedParameter> parameters_;
  std::vector<at::ScalarType> dtypes_;
  RolloutLayout rollout_;
  at::Device device_ = at::kCPU;
  std::vector<int64_t> slice_offsets_;  // In the rollout copy, bytes.
  std::vector<int64_t> shard_views_;    // Elements into the shard, or -1 (see Run).
  std::vector<int64_t> shard_numel_;
  bool trains_ = true, receives_ = true;  // This rank holds training shards / rollout slices.
  int64_t slice_bytes_ = 0, buffer_bytes_ = 0;
  std::vector<BlockCopy> copies_;  // Every launch's, on the host.
  at::Tensor device_copies_;       // The same on the device (GPU plans).
  Launch local_;
  std::vector<Bucket> buckets_;
  ReshardStats stats_;
  // The region table the device copies last received (GPU plans; see Run).
  mutable std::vector<std::byte*> uploaded_regions_;
  mutable at::Tensor host_regions_, device_regions_;
};

// Plans and runs a reshard once (ReshardPlan::Create, then Run).
absl::StatusOr<std::vector<at::Tensor>> Reshard(Communicator& world,
                                                const std::vector<ShardedParameter>& parameters,
                                                const std::vector<at::Tensor>& train_shards,
                                                const TrainLayout& train,
                                                const RolloutLayout& rollout,
                                                const ReshardOptions& options = {},
                                                ReshardStats* stats = nullptr);

}  // namespace rlhfd::parallel
