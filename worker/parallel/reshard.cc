#include "worker/parallel/reshard.h"

#include <ATen/ATen.h>

#include <cstring>

#ifdef RLHFD_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "worker/parallel/block_copy.h"

namespace rlhfd::parallel {
namespace {

// A parameter viewed as (rows, columns), split `parts` ways along `dim` (0 or 1); replicated
// parameters are one part.
struct Grid {
  int64_t rows, columns;
  int dim;  // 0 or 1; replicated parameters split along 0 into one part.

  static Grid Of(const ShardedParameter& p) {
    const int64_t rows = p.shape.empty() ? 1 : p.shape[0];
    const int64_t columns = p.shape.size() > 1 ? p.shape[1] : 1;
    return {rows, columns, p.tp_dim == 1 ? 1 : 0};
  }
  int64_t numel() const { return rows * columns; }
  // Shape (rows, columns) of part `index` of `parts`.
  std::pair<int64_t, int64_t> PartShape(int parts) const {
    return dim == 0 ? std::pair{rows / parts, columns} : std::pair{rows, columns / parts};
  }
};

int Parts(const ShardedParameter& p, int tp) { return p.tp_dim < 0 ? 1 : tp; }

// The flat positions [begin, end) of part `t`'s padded flattening that training rank (d, t)
// holds, clipped to the part's real elements.
std::pair<int64_t, int64_t> ShardRange(const Grid& grid, int parts, int dp, int d) {
  const int64_t part_numel = grid.numel() / parts;
  const int64_t shard = (part_numel + dp - 1) / dp;
  return {std::min(part_numel, d * shard), std::min(part_numel, (d + 1) * shard)};
}

absl::Status CheckDivisible(const ShardedParameter& p, const Grid& grid, int parts) {
  const int64_t extent = grid.dim == 0 ? grid.rows : grid.columns;
  if (extent % parts != 0) {
    return absl::InvalidArgumentError(absl::StrCat("parameter ", p.name, ": dim ", grid.dim, " (",
                                                   extent, ") does not split ", parts, " ways"));
  }
  return absl::OkStatus();
}

// A rectangle of elements moving from a training shard to a rollout slice: `rows` x `columns`,
// starting at flat offsets in each, with each side's row stride.
struct Block {
  int64_t rows, columns;
  int64_t source_offset, source_stride;
  int64_t destination_offset, destination_stride;
  int64_t numel() const { return rows * columns; }
};

// Rows [row_begin, row_end) of a parameter's (rows, columns) matrix: a unit of work.
struct Piece {
  size_t index;
  int64_t row_begin, row_end;
};

// The blocks training rank `source` sends to rollout rank `destination` for one piece, in an
// order both sides compute alike. A shard is a run of a part's row-major elements, so it is at
// most three rectangles (a partial first row, full rows, a partial last row); each is clipped to
// the destination's slice and the piece's rows. No per-element index is ever built.
std::vector<Block> Blocks(const ShardedParameter& p, const Piece& piece, const TrainLayout& train,
                          const RolloutLayout& rollout, int source, int destination) {
  const Grid grid = Grid::Of(p);
  const int train_parts = Parts(p, train.tp), rollout_parts = Parts(p, rollout.tp);
  // A replicated parameter is held alike by every tensor-parallel rank: tp rank 0 sends it.
  if (train_parts == 1 && train.tp > 1 && source % train.tp != 0) return {};
  const int t = train_parts == 1 ? 0 : source % train.tp, d = source / train.tp;
  const int j = rollout_parts == 1 ? 0 : destination % rollout.tp;
  const auto [begin, end] = ShardRange(grid, train_parts, train.dp, d);
  if (begin >= end) return {};
  const auto [part_rows, part_columns] = grid.PartShape(train_parts);
  const auto [slice_rows, slice_columns] = grid.PartShape(rollout_parts);
  // Where the part and the slice sit in the full (rows, columns) matrix.
  const int64_t part_row0 = grid.dim == 0 ? t * part_rows : 0;
  const int64_t part_column0 = grid.dim == 1 ? t * part_columns : 0;
  const int64_t slice_row0 = grid.dim == 0 ? j * slice_rows : 0;
  const int64_t slice_column0 = grid.dim == 1 ? j * slice_columns : 0;
  // The shard's run [begin, end) of the part as rectangles in part coordinates.
  struct Rect {
    int64_t row, rows, column, columns;
  };
  std::vector<Rect> rects;
  const int64_t first_row = begin / part_columns, last_row = (end - 1) / part_columns;
  const int64_t first_column = begin % part_columns, end_column = (end - 1) % part_columns + 1;
  if (first_row == last_row) {
    rects.push_back({first_row, 1, first_column, end_column - first_column});
  } else {
    rects.push_back({first_row, 1, first_column, part_columns - first_column});
    if (last_row - first_row > 1)
      rects.push_back({first_row + 1, last_row - first_row - 1, 0, part_columns});
    rects.push_back({last_row, 1, 0, end_column});
  }
  std::vector<Block> blocks;
  for (const Rect& r : rects) {
    // Full coordinates, clipped to the slice.
    const int64_t row_lo = std::max({r.row + part_row0, slice_row0, piece.row_begin});
    const int64_t row_hi =
        std::min({r.row + r.rows + part_row0, slice_row0 + slice_rows, piece.row_end});
    const int64_t column_lo = std::max(r.column + part_column0, slice_column0);
    const int64_t column_hi =
        std::min(r.column + r.columns + part_column0, slice_column0 + slice_columns);
    if (row_lo >= row_hi || column_lo >= column_hi) continue;
    blocks.push_back(
        {row_hi - row_lo, column_hi - column_lo,
         (row_lo - part_row0) * part_columns + (column_lo - part_column0) - begin, part_columns,
         (row_lo - slice_row0) * slice_columns + (column_lo - slice_column0), slice_columns});
  }
  return blocks;
}

// The packed bytes any rank sends and receives per row of a parameter, at most: a row of its
// slice arrives, and each element of its shard goes to every other rank whose slice holds it.
// The same on every rank, so all ranks cut the same buckets.
int64_t BytesPerRow(const ShardedParameter& p, const TrainLayout& train,
                    const RolloutLayout& rollout, int64_t element_bytes) {
  const Grid grid = Grid::Of(p);
  const int train_parts = Parts(p, train.tp), rollout_parts = Parts(p, rollout.tp);
  const int world = train.dp * train.tp;
  const int64_t received = grid.dim == 1 ? grid.columns / rollout_parts : grid.columns;
  const int64_t held = grid.dim == 1 ? grid.columns / train_parts : grid.columns;
  const int64_t readers = std::min(world / rollout_parts, world - 1);
  return element_bytes * (received + held * readers);
}

// Consecutive pieces whose packed bytes stay within the budget; a parameter larger than the
// budget is cut into row ranges (at least one row each).
std::vector<std::vector<Piece>> Buckets(const std::vector<ShardedParameter>& parameters,
                                        const std::vector<at::Tensor>& shards,
                                        const TrainLayout& train, const RolloutLayout& rollout,
                                        int64_t budget) {
  std::vector<std::vector<Piece>> buckets(1);
  int64_t used = 0;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const int64_t rows = Grid::Of(parameters[i]).rows;
    const int64_t row_bytes =
        std::max<int64_t>(1, BytesPerRow(parameters[i], train, rollout, shards[i].element_size()));
    for (int64_t row = 0; row < rows;) {
      int64_t take = std::min(rows - row, (budget - used) / row_bytes);
      if (take <= 0 && used > 0) {  // Full: start the next bucket.
        buckets.emplace_back();
        used = 0;
        continue;
      }
      take = std::max<int64_t>(take, 1);
      buckets.back().push_back({i, row, row + take});
      used += take * row_bytes;
      row += take;
    }
  }
  return buckets;
}

// Runs planned copies on the tensors' device: one kernel on the current stream for a GPU, row by
// row on the host for a CPU.
absl::Status RunCopies(std::vector<BlockCopy> copies, const at::Device& device) {
  const int64_t tiles = PlanBlockCopies(copies);
  if (copies.empty()) return absl::OkStatus();
  if (device.is_cpu()) {
    CopyBlocksOnHost(copies);
    return absl::OkStatus();
  }
#ifdef RLHFD_HAVE_CUDA
  const int64_t bytes = static_cast<int64_t>(copies.size() * sizeof(BlockCopy));
  // Pinned, so the upload is asynchronous; the caching host allocator keeps the buffer until the
  // upload has run.
  at::Tensor host = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  std::memcpy(host.data_ptr(), copies.data(), bytes);
  const at::Tensor descriptors = host.to(device, /*non_blocking=*/true);
  const cudaError_t error = CopyBlocksOnDevice(
      static_cast<const BlockCopy*>(descriptors.const_data_ptr()),
      static_cast<int64_t>(copies.size()), tiles, c10::cuda::getCurrentCUDAStream(device.index()));
  if (error != cudaSuccess) {
    return absl::InternalError(absl::StrCat("reshard copy kernel: ", cudaGetErrorString(error)));
  }
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError("reshard: this build has no CUDA support");
#endif
}

std::byte* Bytes(const at::Tensor& t) { return static_cast<std::byte*>(t.data_ptr()); }

}  // namespace

int64_t TrainShardNumel(const ShardedParameter& parameter, const TrainLayout& layout) {
  const Grid grid = Grid::Of(parameter);
  const int64_t part = grid.numel() / Parts(parameter, layout.tp);
  return (part + layout.dp - 1) / layout.dp;
}

at::Tensor TrainShard(const at::Tensor& full, const ShardedParameter& parameter,
                      const TrainLayout& layout, int rank) {
  const Grid grid = Grid::Of(parameter);
  const int parts = Parts(parameter, layout.tp);
  const int t = parts == 1 ? 0 : rank % layout.tp, d = rank / layout.tp;
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

absl::StatusOr<std::vector<at::Tensor>> Reshard(
    Communicator& world, const std::vector<ShardedParameter>& parameters,
    const std::vector<at::Tensor>& train_shards, const TrainLayout& train,
    const RolloutLayout& rollout, const ReshardOptions& options, ReshardStats* stats) {
  const int size = world.size(), me = world.rank();
  if (train.dp * train.tp != size || rollout.tp * rollout.dp != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("reshard: train dp ", train.dp, " x tp ", train.tp, " and rollout tp ",
                     rollout.tp, " x dp ", rollout.dp, " must both equal the ", size, " ranks"));
  }
  if (train_shards.size() != parameters.size() || parameters.empty()) {
    return absl::InvalidArgumentError("reshard: one training shard per parameter");
  }
  if (options.bucket_bytes <= 0) {
    return absl::InvalidArgumentError("reshard: bucket_bytes must be positive");
  }
  const at::Device device = train_shards.front().device();
  for (size_t i = 0; i < parameters.size(); ++i) {
    const ShardedParameter& p = parameters[i];
    const Grid grid = Grid::Of(p);
    RETURN_IF_ERROR(CheckDivisible(p, grid, Parts(p, train.tp)));
    RETURN_IF_ERROR(CheckDivisible(p, grid, Parts(p, rollout.tp)));
    const at::Tensor& shard = train_shards[i];
    if (!shard.defined() || shard.device() != device || !shard.is_contiguous() ||
        shard.numel() != TrainShardNumel(p, train)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "reshard: the training shard of ", p.name, " must be a contiguous tensor of ",
          TrainShardNumel(p, train), " elements on ", device.str()));
    }
  }
  // The rollout copy: every slice in one allocation, each 256-byte aligned.
  std::vector<int64_t> slice_offsets;
  int64_t total = 0;
  for (size_t i = 0; i < parameters.size(); ++i) {
    slice_offsets.push_back(total);
    const auto [rows, columns] =
        Grid::Of(parameters[i]).PartShape(Parts(parameters[i], rollout.tp));
    total += (rows * columns * train_shards[i].element_size() + 255) / 256 * 256;
  }
  const at::Tensor copy = at::empty({total}, at::TensorOptions().dtype(at::kByte).device(device));

  ReshardStats moved;
  const auto message_offset = [](int64_t bytes) { return (bytes + 15) / 16 * 16; };
  for (const std::vector<Piece>& bucket :
       Buckets(parameters, train_shards, train, rollout, options.bucket_bytes)) {
    // Each peer's message is its blocks back to back (16-byte aligned) in piece order, which
    // sender and receiver enumerate alike.
    struct Planned {
      size_t index;
      Block block;
      int64_t offset;  // In the message.
    };
    std::vector<std::vector<Planned>> sends(size), receives(size);
    std::vector<int64_t> send_bytes(size, 0), receive_bytes(size, 0);
    std::vector<BlockCopy> before, after;  // Packing and local copies; unpacking.
    for (const Piece& piece : bucket) {
      const ShardedParameter& p = parameters[piece.index];
      const int64_t element = train_shards[piece.index].element_size();
      std::byte* const slice = Bytes(copy) + slice_offsets[piece.index];
      std::byte* const shard = Bytes(train_shards[piece.index]);
      for (int peer = 0; peer < size; ++peer) {
        for (const Block& b : Blocks(p, piece, train, rollout, me, peer)) {
          const int64_t bytes = b.numel() * element;
          if (peer == me) {
            before.push_back({shard + b.source_offset * element,
                              slice + b.destination_offset * element, b.rows, b.columns * element,
                              b.source_stride * element, b.destination_stride * element});
            moved.local_bytes += bytes;
            continue;
          }
          sends[peer].push_back({piece.index, b, send_bytes[peer]});
          send_bytes[peer] = message_offset(send_bytes[peer] + bytes);
          moved.sent_bytes += bytes;
        }
        if (peer == me) continue;
        for (const Block& b : Blocks(p, piece, train, rollout, peer, me)) {
          receives[peer].push_back({piece.index, b, receive_bytes[peer]});
          receive_bytes[peer] = message_offset(receive_bytes[peer] + b.numel() * element);
          moved.received_bytes += b.numel() * element;
        }
      }
    }
    // One send and one receive buffer for all peers.
    std::vector<int64_t> send_start(size + 1, 0), receive_start(size + 1, 0);
    for (int peer = 0; peer < size; ++peer) {
      send_start[peer + 1] = send_start[peer] + send_bytes[peer];
      receive_start[peer + 1] = receive_start[peer] + receive_bytes[peer];
    }
    const auto bytes_options = at::TensorOptions().dtype(at::kByte).device(device);
    const at::Tensor outbox = at::empty({send_start[size]}, bytes_options);
    const at::Tensor inbox = at::empty({receive_start[size]}, bytes_options);
    std::vector<PeerTransfer> transfers;
    for (int peer = 0; peer < size; ++peer) {
      for (const Planned& s : sends[peer]) {
        const int64_t element = train_shards[s.index].element_size();
        before.push_back({Bytes(train_shards[s.index]) + s.block.source_offset * element,
                          Bytes(outbox) + send_start[peer] + s.offset, s.block.rows,
                          s.block.columns * element, s.block.source_stride * element,
                          s.block.columns * element});
      }
      for (const Planned& r : receives[peer]) {
        const int64_t element = train_shards[r.index].element_size();
        after.push_back(
            {Bytes(inbox) + receive_start[peer] + r.offset,
             Bytes(copy) + slice_offsets[r.index] + r.block.destination_offset * element,
             r.block.rows, r.block.columns * element, r.block.columns * element,
             r.block.destination_stride * element});
      }
      if (send_bytes[peer] > 0) {
        transfers.push_back({PeerTransfer::Direction::kSend, peer,
                             outbox.narrow(0, send_start[peer], send_bytes[peer])});
      }
      if (receive_bytes[peer] > 0) {
        transfers.push_back({PeerTransfer::Direction::kRecv, peer,
                             inbox.narrow(0, receive_start[peer], receive_bytes[peer])});
      }
    }
    RETURN_IF_ERROR(RunCopies(std::move(before), device));
    if (!transfers.empty()) RETURN_IF_ERROR(world.SendRecvQueued(transfers));
    RETURN_IF_ERROR(RunCopies(std::move(after), device));
    ++moved.buckets;
  }
  RETURN_IF_ERROR(world.Synchronize());

  std::vector<at::Tensor> slices;
  for (size_t i = 0; i < parameters.size(); ++i) {
    std::vector<int64_t> shape = parameters[i].shape;
    if (parameters[i].tp_dim >= 0) shape[parameters[i].tp_dim] /= Parts(parameters[i], rollout.tp);
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    slices.push_back(copy.narrow(0, slice_offsets[i], numel * train_shards[i].element_size())
                         .view(train_shards[i].scalar_type())
                         .view(shape));
  }
  if (stats != nullptr) *stats = moved;
  return slices;
}

}  // namespace rlhfd::parallel
