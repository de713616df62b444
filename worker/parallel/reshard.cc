#include "worker/parallel/reshard.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"

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

// The blocks training rank `source` sends to rollout rank `destination` for one parameter, in an
// order both sides compute alike. A shard is a run of a part's row-major elements, so it is at
// most three rectangles (a partial first row, full rows, a partial last row); each is clipped to
// the destination's slice. No per-element index is ever built.
std::vector<Block> Blocks(const ShardedParameter& p, const TrainLayout& train,
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
    const int64_t row_lo = std::max(r.row + part_row0, slice_row0);
    const int64_t row_hi = std::min(r.row + r.rows + part_row0, slice_row0 + slice_rows);
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

at::Tensor SourceView(const at::Tensor& shard, const Block& b) {
  return shard.as_strided({b.rows, b.columns}, {b.source_stride, 1}, b.source_offset);
}

at::Tensor DestinationView(const at::Tensor& slice, const Block& b) {
  return slice.as_strided({b.rows, b.columns}, {b.destination_stride, 1}, b.destination_offset);
}

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

absl::StatusOr<std::vector<at::Tensor>> Reshard(Communicator& world,
                                                const std::vector<ShardedParameter>& parameters,
                                                const std::vector<at::Tensor>& train_shards,
                                                const TrainLayout& train,
                                                const RolloutLayout& rollout, ReshardStats* stats) {
  const int size = world.size(), me = world.rank();
  ReshardStats moved;
  if (train.dp * train.tp != size || rollout.tp * rollout.dp != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("reshard: train dp ", train.dp, " x tp ", train.tp, " and rollout tp ",
                     rollout.tp, " x dp ", rollout.dp, " must both equal the ", size, " ranks"));
  }
  if (train_shards.size() != parameters.size() || parameters.empty()) {
    return absl::InvalidArgumentError("reshard: one training shard per parameter");
  }
  const at::TensorOptions options = train_shards.front().options();
  // One message per block, in the order both sides enumerate them. A block that is one run of
  // memory is sent from the shard and received into the slice as it is; only strided blocks
  // (row-parallel weights cut by columns) go through a temporary copy.
  std::vector<at::Tensor> slices;
  std::vector<PeerTransfer> sends, receives;
  std::vector<std::pair<at::Tensor, at::Tensor>> unpack;  // (received copy, its place)
  for (size_t i = 0; i < parameters.size(); ++i) {
    const ShardedParameter& p = parameters[i];
    const Grid grid = Grid::Of(p);
    RETURN_IF_ERROR(CheckDivisible(p, grid, Parts(p, train.tp)));
    RETURN_IF_ERROR(CheckDivisible(p, grid, Parts(p, rollout.tp)));
    const auto [rows, columns] = grid.PartShape(Parts(p, rollout.tp));
    slices.push_back(at::empty({rows * columns}, options));
    for (int peer = 0; peer < size; ++peer) {
      for (const Block& b : Blocks(p, train, rollout, me, peer)) {
        const at::Tensor from = SourceView(train_shards[i], b);
        if (peer == me) {
          DestinationView(slices[i], b).copy_(from);
          moved.local += b.numel();
          continue;
        }
        sends.push_back({PeerTransfer::Direction::kSend, peer,
                         from.is_contiguous() ? from : from.contiguous()});
        moved.sent += b.numel();
      }
      if (peer == me) continue;
      for (const Block& b : Blocks(p, train, rollout, peer, me)) {
        const at::Tensor to = DestinationView(slices[i], b);
        if (to.is_contiguous()) {
          receives.push_back({PeerTransfer::Direction::kRecv, peer, to});
        } else {
          at::Tensor staging = at::empty({b.rows, b.columns}, options);
          receives.push_back({PeerTransfer::Direction::kRecv, peer, staging});
          unpack.emplace_back(staging, to);
        }
        moved.received += b.numel();
      }
    }
  }
  sends.insert(sends.end(), receives.begin(), receives.end());
  RETURN_IF_ERROR(world.SendRecv(sends));
  for (auto& [staging, to] : unpack) to.copy_(staging);
  for (size_t i = 0; i < parameters.size(); ++i) {
    std::vector<int64_t> shape = parameters[i].shape;
    if (parameters[i].tp_dim >= 0) shape[parameters[i].tp_dim] /= Parts(parameters[i], rollout.tp);
    slices[i] = slices[i].view(shape);
  }
  if (stats != nullptr) *stats = moved;
  return slices;
}

}  // namespace rlhfd::parallel
