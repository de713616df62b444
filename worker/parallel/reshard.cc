#include "worker/parallel/reshard.h"

#include <ATen/ATen.h>
#include <c10/core/TensorImpl.h>

#include <chrono>
#include <cstring>
#include <map>

#ifdef RLHFD_HAVE_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "worker/parallel/reshard_geometry.h"

namespace rlhfd::parallel {

using reshard_geometry::Block;
using reshard_geometry::Blocks;
using reshard_geometry::CheckDivisible;
using reshard_geometry::CheckTrainRanges;
using reshard_geometry::Grid;
using reshard_geometry::Parts;
using reshard_geometry::Piece;
using reshard_geometry::SliceInOwnShard;

namespace {

int64_t Aligned(int64_t bytes, int64_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

// Region numbers of a plan's copies: the shards are 0 .. P-1, then these.
struct Regions {
  int32_t slices, buffer, count;
  explicit Regions(size_t parameters)
      : slices(static_cast<int32_t>(parameters)), buffer(slices + 1), count(slices + 2) {}
};

// A tensor over `base`'s storage with the given geometry, made directly: as_strided goes through
// the dispatcher and autograd's view tracking, about 4x the time, and a model has hundreds of
// slices. The slices are weights for generation, not part of any autograd graph.
at::Tensor StorageView(const at::Tensor& base, at::IntArrayRef shape, at::IntArrayRef strides,
                       int64_t offset) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(base.storage()), base.key_set(),
                                                   base.dtype());
  impl->set_sizes_and_strides(shape, strides, offset);
  return at::Tensor(std::move(impl));
}

}  // namespace

int64_t TrainShardNumel(const ShardedParameter& parameter, const TrainLayout& layout, int rank) {
  if (!parameter.train_ranges.empty()) {
    const auto [begin, end] = parameter.train_ranges[rank / layout.tp];
    return end - begin;
  }
  const Grid grid = Grid::Of(parameter);
  const int64_t part = grid.numel() / Parts(parameter, layout.tp);
  return (part + layout.dp - 1) / layout.dp;
}

at::Tensor TrainShard(const at::Tensor& full, const ShardedParameter& parameter,
                      const TrainLayout& layout, int rank) {
  const Grid grid = Grid::Of(parameter);
  const int parts = Parts(parameter, layout.tp);
  const int t = parts == 1 ? 0 : rank % layout.tp, d = rank / layout.tp;
  if (!parameter.train_ranges.empty()) {
    const auto [begin, end] = parameter.train_ranges[d];
    return full.reshape({-1}).narrow(0, begin, end - begin).clone();
  }
  const at::Tensor matrix = full.reshape({grid.rows, grid.columns});
  const at::Tensor part = matrix.chunk(parts, grid.dim)[t].reshape({-1});
  const int64_t shard = (part.numel() + layout.dp - 1) / layout.dp;
  at::Tensor padded = at::zeros({shard * layout.dp}, full.options());
  padded.narrow(0, 0, part.numel()).copy_(part);
  return padded.narrow(0, d * shard, shard).clone();
}

at::Tensor RolloutSlice(const at::Tensor& full, const ShardedParameter& parameter,
                        const RolloutLayout& layout, int rank) {
  const Grid grid = Grid::Of(parameter);
  const int parts = Parts(parameter, layout.tp);
  const int j = parts == 1 ? 0 : rank % layout.tp;
  at::Tensor slice = full.reshape({grid.rows, grid.columns}).chunk(parts, grid.dim)[j];
  std::vector<int64_t> shape = parameter.shape;
  if (parameter.tp_dim >= 0) shape[parameter.tp_dim] /= parts;
  return slice.contiguous().view(shape);
}

namespace {

// Each communicator rank's place in a layout of `count` ranks (-1: none), from the ranks listed
// in order (empty: ranks 0 .. count - 1).
absl::StatusOr<std::vector<int>> PlacesOf(const std::vector<int>& listed, int count, int size,
                                          const char* what) {
  std::vector<int> ranks = listed;
  if (ranks.empty()) {
    for (int r = 0; r < count; ++r) ranks.push_back(r);
  }
  if (static_cast<int>(ranks.size()) != count) {
    return absl::InvalidArgumentError(absl::StrCat("reshard: the ", what, " layout has ", count,
                                                   " ranks, but ", ranks.size(), " are listed"));
  }
  std::vector<int> places(static_cast<size_t>(size), -1);
  for (int place = 0; place < count; ++place) {
    const int rank = ranks[place];
    if (rank < 0 || rank >= size || places[rank] >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("reshard: ", what, " rank ", place, " is communicator rank ", rank,
                       ", outside the ", size, " ranks or listed twice"));
    }
    places[rank] = place;
  }
  return places;
}

}  // namespace

absl::StatusOr<ReshardPlan> ReshardPlan::Create(
    Communicator& world, const std::vector<ShardedParameter>& parameters,
    const std::vector<at::ScalarType>& dtypes, const TrainLayout& train,
    const RolloutLayout& rollout, const at::Device& device, const ReshardOptions& options) {
  const int size = world.size(), me = world.rank();
  const int train_count = train.dp * train.tp, rollout_count = rollout.tp * rollout.dp;
  if (options.train_ranks.empty() && options.rollout_ranks.empty() &&
      (train_count != size || rollout_count != size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reshard: train dp ", train.dp, " x tp ", train.tp, " and rollout tp ",
                     rollout.tp, " x dp ", rollout.dp, " must both equal the ", size, " ranks"));
  }
  ASSIGN_OR_RETURN(const std::vector<int> train_place,
                   PlacesOf(options.train_ranks, train_count, size, "training"));
  ASSIGN_OR_RETURN(const std::vector<int> rollout_place,
                   PlacesOf(options.rollout_ranks, rollout_count, size, "rollout"));
  if (dtypes.size() != parameters.size() || parameters.empty()) {
    return absl::InvalidArgumentError("reshard: one dtype per parameter, at least one parameter");
  }
  if (options.bucket_bytes <= 0) {
    return absl::InvalidArgumentError("reshard: bucket_bytes must be positive");
  }
  // The blocks a training place sends a rollout place (none where either is -1).
  const auto blocks = [&](const ShardedParameter& p, const Piece& piece, int from,
                          int to) -> std::vector<Block> {
    if (from < 0 || to < 0) return {};
    return Blocks(p, piece, train, rollout, from, to);
  };
  const int my_train = train_place[me], my_rollout = rollout_place[me];
  ReshardPlan plan;
  plan.parameters_ = parameters;
  plan.dtypes_ = dtypes;
  plan.rollout_ = rollout;
  plan.device_ = device;
  plan.trains_ = my_train >= 0;
  plan.receives_ = my_rollout >= 0;
  std::vector<int64_t> element_bytes;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const ShardedParameter& p = parameters[i];
    const Grid grid = Grid::Of(p);
    RETURN_IF_ERROR(CheckDivisible(p, grid, Parts(p, train.tp)));
    RETURN_IF_ERROR(CheckTrainRanges(p, grid, train));
    RETURN_IF_ERROR(CheckDivisible(p, grid, Parts(p, rollout.tp)));
    element_bytes.push_back(static_cast<int64_t>(c10::elementSize(dtypes[i])));
    // The rollout copy: every slice that is not a view of the shard in one allocation, each
    // 256-byte aligned. A view needs the same place in both layouts.
    plan.shard_views_.push_back(my_train >= 0 && my_train == my_rollout
                                    ? SliceInOwnShard(p, train, rollout, my_train, train_count)
                                    : -1);
    plan.shard_numel_.push_back(my_train >= 0 ? TrainShardNumel(p, train, my_train) : 0);
    plan.slice_offsets_.push_back(plan.slice_bytes_);
    if (my_rollout < 0) continue;
    const int64_t slice_bytes = grid.numel() / Parts(p, rollout.tp) * element_bytes[i];
    if (plan.shard_views_[i] >= 0) {
      plan.stats_.shared_bytes += slice_bytes;
    } else {
      plan.slice_bytes_ += Aligned(slice_bytes, 256);
    }
  }

  // Pieces: parameters cut into row ranges of at most an eighth of a bucket (full-tensor bytes),
  // the same on every rank; this rank's packed bytes per piece (each block 16-byte aligned in
  // its message), then the largest over the ranks, so every rank cuts the same buckets.
  std::vector<Piece> pieces;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Grid grid = Grid::Of(parameters[i]);
    const int64_t row_bytes = grid.columns * element_bytes[i];
    const int64_t rows_per_piece = std::max<int64_t>(1, options.bucket_bytes / 8 / row_bytes);
    for (int64_t row = 0; row < grid.rows; row += rows_per_piece) {
      pieces.push_back({i, row, std::min(grid.rows, row + rows_per_piece)});
    }
  }
  // Two more entries carry a digest of the training ranges and its negation: every rank must
  // cut the parameters alike, or the messages would not match (a hang or wrong weights).
  at::Tensor packed = at::zeros({static_cast<int64_t>(pieces.size()) + 2}, at::kLong);
  for (size_t k = 0; k < pieces.size(); ++k) {
    const Piece& piece = pieces[k];
    const ShardedParameter& p = parameters[piece.index];
    int64_t bytes = 0;
    for (int peer = 0; peer < size; ++peer) {
      if (peer == me) continue;
      for (const Block& b : blocks(p, piece, my_train, rollout_place[peer])) {
        bytes += Aligned(b.numel() * element_bytes[piece.index], 16);
      }
      for (const Block& b : blocks(p, piece, train_place[peer], my_rollout)) {
        bytes += Aligned(b.numel() * element_bytes[piece.index], 16);
      }
    }
    packed.data_ptr<int64_t>()[k] = bytes;
  }
  uint64_t digest = 1469598103934665603ull;  // FNV-1a over every parameter's ranges
  for (const ShardedParameter& p : parameters) {
    for (const auto& [begin, end] : p.train_ranges) {
      for (const int64_t bound : {begin, end}) {
        digest = (digest ^ static_cast<uint64_t>(bound)) * 1099511628211ull;
      }
    }
  }
  const auto signed_digest = static_cast<int64_t>(digest >> 2);  // its negation fits too
  packed.data_ptr<int64_t>()[pieces.size()] = signed_digest;
  packed.data_ptr<int64_t>()[pieces.size() + 1] = -signed_digest;
  at::Tensor agreed = packed.to(device);
  RETURN_IF_ERROR(world.AllReduce(agreed, ReduceOp::kMax));
  agreed = agreed.cpu();
  const int64_t* piece_bytes = agreed.data_ptr<int64_t>();
  if (piece_bytes[pieces.size()] != -piece_bytes[pieces.size() + 1]) {
    return absl::InvalidArgumentError(
        "reshard: the ranks were given different training ranges (train_ranges) for the same "
        "parameters");
  }

  // Copies of one launch, planned and appended to the plan's list.
  const auto add_launch = [&plan](std::vector<BlockCopy> copies) {
    Launch launch;
    launch.tiles = PlanBlockCopies(copies);
    launch.begin = static_cast<int64_t>(plan.copies_.size());
    plan.copies_.insert(plan.copies_.end(), copies.begin(), copies.end());
    launch.end = static_cast<int64_t>(plan.copies_.size());
    return launch;
  };
  // A block as a copy between regions; offsets in bytes, pitches in elements.
  const auto copy_of = [&](const Piece& piece, const Block& b, int32_t from, int64_t from_offset,
                           int64_t from_pitch, int32_t to, int64_t to_offset, int64_t to_pitch) {
    const int64_t element = element_bytes[piece.index];
    BlockCopy copy;
    copy.source_region = from;
    copy.destination_region = to;
    copy.source_offset = from_offset;
    copy.destination_offset = to_offset;
    copy.rows = b.rows;
    copy.row_bytes = b.columns * element;
    copy.source_pitch = from_pitch * element;
    copy.destination_pitch = to_pitch * element;
    return copy;
  };
  const Regions regions(parameters.size());
  std::vector<BlockCopy> local;
  for (size_t first = 0; first < pieces.size();) {
    // Consecutive pieces within the budget (at least one).
    size_t last = first + 1;
    int64_t used = piece_bytes[first];
    while (last < pieces.size() && used + piece_bytes[last] <= options.bucket_bytes) {
      used += piece_bytes[last++];
    }
    Bucket bucket;
    bucket.send_bytes.assign(size, 0);
    bucket.receive_bytes.assign(size, 0);
    std::vector<BlockCopy> pack, unpack;
    // The bucket's buffer: every peer's outgoing message, then every peer's incoming one.
    int64_t send_offset = 0, receive_offset = 0;
    for (int peer = 0; peer < size; ++peer) {
      // Each peer's message: its blocks back to back (16-byte aligned) in piece order, which
      // sender and receiver enumerate alike.
      const int64_t send_start = send_offset, receive_start = receive_offset;
      for (size_t k = first; k < last; ++k) {
        const Piece& piece = pieces[k];
        const ShardedParameter& p = parameters[piece.index];
        const int32_t shard = static_cast<int32_t>(piece.index);
        const int64_t element = element_bytes[piece.index];
        const int64_t slice = plan.slice_offsets_[piece.index];
        for (const Block& b : blocks(p, piece, my_train, rollout_place[peer])) {
          if (peer == me) {
            if (plan.shard_views_[piece.index] >= 0) continue;  // Nothing to copy.
            local.push_back(copy_of(piece, b, shard, b.source_offset * element, b.source_stride,
                                    regions.slices, slice + b.destination_offset * element,
                                    b.destination_stride));
            plan.stats_.local_bytes += b.numel() * element;
            continue;
          }
          pack.push_back(copy_of(piece, b, shard, b.source_offset * element, b.source_stride,
                                 regions.buffer, send_offset, b.columns));
          send_offset += Aligned(b.numel() * element, 16);
          plan.stats_.sent_bytes += b.numel() * element;
        }
        if (peer == me) continue;
        for (const Block& b : blocks(p, piece, train_place[peer], my_rollout)) {
          unpack.push_back(copy_of(piece, b, regions.buffer, receive_offset, b.columns,
                                   regions.slices, slice + b.destination_offset * element,
                                   b.destination_stride));
          receive_offset += Aligned(b.numel() * element, 16);
          plan.stats_.received_bytes += b.numel() * element;
        }
      }
      bucket.send_bytes[peer] = send_offset - send_start;
      bucket.receive_bytes[peer] = receive_offset - receive_start;
    }
    bucket.send_total = send_offset;
    for (BlockCopy& copy : unpack) copy.source_offset += send_offset;
    bucket.pack = add_launch(std::move(pack));
    bucket.unpack = add_launch(std::move(unpack));
    plan.buffer_bytes_ = std::max(plan.buffer_bytes_, send_offset + receive_offset);
    plan.buckets_.push_back(std::move(bucket));
    first = last;
  }
  plan.local_ = add_launch(std::move(local));
  plan.stats_.buckets = static_cast<int64_t>(plan.buckets_.size());
  plan.stats_.buffer_bytes = plan.buffer_bytes_;
  if (device.is_cuda() && !plan.copies_.empty()) {
    const int64_t bytes = static_cast<int64_t>(plan.copies_.size() * sizeof(BlockCopy));
    at::Tensor host = at::empty({bytes}, at::kByte);
    std::memcpy(host.data_ptr(), plan.copies_.data(), bytes);
    plan.device_copies_ = host.to(device);
  }
  return plan;
}

absl::StatusOr<std::vector<at::Tensor>> ReshardPlan::Run(
    Communicator& world, const std::vector<at::Tensor>& train_shards, ReshardTiming* timing) const {
  const auto start = std::chrono::steady_clock::now();
  ReshardTiming times;
  const auto since_start = [&start]() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const size_t shards_expected = trains_ ? parameters_.size() : 0;
  if (train_shards.size() != shards_expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reshard: ", shards_expected, " training shards expected, got ", train_shards.size()));
  }
  for (size_t i = 0; i < shards_expected; ++i) {
    const at::Tensor& shard = train_shards[i];
    const int64_t numel = shard_numel_[i];
    if (!shard.defined() || shard.device() != device_ || !shard.is_contiguous() ||
        shard.numel() != numel || shard.scalar_type() != dtypes_[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "reshard: the training shard of ", parameters_[i].name, " must be a contiguous ",
          c10::toString(dtypes_[i]), " tensor of ", numel, " elements on ", device_.str()));
    }
  }
  const auto bytes = at::TensorOptions().dtype(at::kByte).device(device_);
  const at::Tensor copy = at::empty({slice_bytes_}, bytes);
  const at::Tensor buffer = at::empty({buffer_bytes_}, bytes);
  const Regions numbering(parameters_.size());
  std::vector<std::byte*> regions(numbering.count);  // a rank that trains nothing: no shards
  for (size_t i = 0; i < train_shards.size(); ++i) {
    regions[i] = static_cast<std::byte*>(train_shards[i].data_ptr());
  }
  regions[numbering.slices] = static_cast<std::byte*>(copy.data_ptr());
  regions[numbering.buffer] = static_cast<std::byte*>(buffer.data_ptr());
  // Each bucket's messages: one send and one receive per peer with bytes to move.
  const auto messages = [&](const Bucket& bucket) {
    std::vector<PeerTransfer> transfers;
    int64_t send_offset = 0, receive_offset = bucket.send_total;
    for (int peer = 0; peer < world.size(); ++peer) {
      if (bucket.send_bytes[peer] > 0) {
        transfers.push_back({PeerTransfer::Direction::kSend, peer,
                             buffer.narrow(0, send_offset, bucket.send_bytes[peer])});
      }
      if (bucket.receive_bytes[peer] > 0) {
        transfers.push_back({PeerTransfer::Direction::kRecv, peer,
                             buffer.narrow(0, receive_offset, bucket.receive_bytes[peer])});
      }
      send_offset += bucket.send_bytes[peer];
      receive_offset += bucket.receive_bytes[peer];
    }
    return transfers;
  };

  // The slices' views (on the GPU, made while the device works).
  std::vector<at::Tensor> slices;
  const auto make_views = [&]() {
    if (!receives_) return;
    std::map<at::ScalarType, at::Tensor> typed;  // The rollout copy viewed in each dtype.
    for (size_t i = 0; i < parameters_.size(); ++i) {
      std::vector<int64_t> shape = parameters_[i].shape;
      if (parameters_[i].tp_dim >= 0) {
        shape[parameters_[i].tp_dim] /= Parts(parameters_[i], rollout_.tp);
      }
      std::vector<int64_t> strides(shape.size(), 1);
      for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
        strides[d] = strides[d + 1] * shape[d + 1];
      }
      if (shard_views_[i] >= 0) {
        const at::Tensor& shard = train_shards[i];
        slices.push_back(
            StorageView(shard, shape, strides, shard.storage_offset() + shard_views_[i]));
        continue;
      }
      auto [view, inserted] = typed.try_emplace(dtypes_[i]);
      if (inserted) view->second = copy.view(dtypes_[i]);
      const int64_t element = static_cast<int64_t>(c10::elementSize(dtypes_[i]));
      slices.push_back(StorageView(view->second, shape, strides, slice_offsets_[i] / element));
    }
  };

  if (device_.is_cpu()) {
    const auto run = [&](const Launch& launch) {
      CopyBlocksOnHost(copies_.data() + launch.begin, launch.end - launch.begin, regions.data());
    };
    run(local_);
    for (const Bucket& bucket : buckets_) {
      run(bucket.pack);
      const std::vector<PeerTransfer> transfers = messages(bucket);
      if (!transfers.empty()) RETURN_IF_ERROR(world.SendRecvQueued(transfers, {}));
      run(bucket.unpack);
    }
    make_views();
  } else {
#ifdef RLHFD_HAVE_CUDA
    // Accesses as wide as the regions' alignment allows (allocations are 512-byte aligned).
    int64_t max_vector_bytes = 16;
    for (std::byte* region : regions) {
      while (reinterpret_cast<uintptr_t>(region) % max_vector_bytes != 0) max_vector_bytes /= 2;
    }
    const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device_.index());
    // The kernels' table of region addresses, uploaded only when an address changed (shards
    // persist and the caching allocator tends to hand back the same blocks). The previous run
    // has finished (Run waits), so the pinned mirror is free to rewrite.
    const int64_t table_bytes = numbering.count * static_cast<int64_t>(sizeof(std::byte*));
    if (!device_regions_.defined()) {
      host_regions_ =
          at::empty({table_bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
      device_regions_ = at::empty({table_bytes}, bytes);
    }
    if (uploaded_regions_ != regions) {
      std::memcpy(host_regions_.data_ptr(), regions.data(), table_bytes);
      const cudaError_t error =
          cudaMemcpyAsync(device_regions_.data_ptr(), host_regions_.data_ptr(), table_bytes,
                          cudaMemcpyHostToDevice, stream);
      if (error != cudaSuccess) {
        return absl::InternalError(absl::StrCat("reshard: ", cudaGetErrorString(error)));
      }
      uploaded_regions_ = regions;
    }
    const auto* table = static_cast<std::byte* const*>(device_regions_.const_data_ptr());
    const auto* copies = static_cast<const BlockCopy*>(device_copies_.const_data_ptr());
    const auto run = [&](const Launch& launch, cudaStream_t on) -> absl::Status {
      const cudaError_t error = CopyBlocksOnDevice(copies + launch.begin, launch.end - launch.begin,
                                                   launch.tiles, table, max_vector_bytes, on);
      if (error != cudaSuccess) {
        return absl::InternalError(
            absl::StrCat("reshard copy kernel: ", cudaGetErrorString(error)));
      }
      return absl::OkStatus();
    };
    // The local blocks (most of the bytes when little moves) go on a side stream, overlapping
    // the transfers; they and the slices' views are queued and made while NCCL queues the first
    // transfers, which are on the critical path. The current stream waits for the side stream at
    // the end.
    at::cuda::CUDAEvent inputs_ready, local_done;
    inputs_ready.record(stream);
    absl::Status local_status;
    const auto meanwhile = [&]() {
      if (local_.end > local_.begin) {
        const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device_.index());
        inputs_ready.block(side);
        local_status = run(local_, side);
        local_done.record(side);
      }
      make_views();
    };
    for (size_t k = 0; k < buckets_.size(); ++k) {
      RETURN_IF_ERROR(run(buckets_[k].pack, stream));
      if (k == 0) times.first_pack_queued = since_start();
      const std::vector<PeerTransfer> transfers = messages(buckets_[k]);
      if (k == 0) {
        if (!transfers.empty()) {
          RETURN_IF_ERROR(world.SendRecvQueued(transfers, meanwhile));
        } else {
          meanwhile();
        }
        RETURN_IF_ERROR(local_status);
        times.first_transfer_queued = since_start();
      } else if (!transfers.empty()) {
        RETURN_IF_ERROR(world.SendRecvQueued(transfers, {}));
      }
      RETURN_IF_ERROR(run(buckets_[k].unpack, stream));
    }
    if (local_done.isCreated()) local_done.block(stream);
    times.all_queued = since_start();
#else
    return absl::FailedPreconditionError("reshard: this build has no CUDA support");
#endif
  }
  RETURN_IF_ERROR(world.Synchronize());
  times.done = since_start();
  if (timing != nullptr) *timing = times;
  return slices;
}

absl::StatusOr<std::vector<at::Tensor>> Reshard(
    Communicator& world, const std::vector<ShardedParameter>& parameters,
    const std::vector<at::Tensor>& train_shards, const TrainLayout& train,
    const RolloutLayout& rollout, const ReshardOptions& options, ReshardStats* stats) {
  if (train_shards.size() != parameters.size() || parameters.empty()) {
    return absl::InvalidArgumentError("reshard: one training shard per parameter");
  }
  std::vector<at::ScalarType> dtypes;
  for (const at::Tensor& shard : train_shards) {
    if (!shard.defined()) return absl::InvalidArgumentError("reshard: undefined training shard");
    dtypes.push_back(shard.scalar_type());
  }
  ASSIGN_OR_RETURN(const ReshardPlan plan,
                   ReshardPlan::Create(world, parameters, dtypes, train, rollout,
                                       train_shards.front().device(), options));
  if (stats != nullptr) *stats = plan.stats();
  return plan.Run(world, train_shards);
}

}  // namespace rlhfd::parallel
