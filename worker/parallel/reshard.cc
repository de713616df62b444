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

// Full-tensor (row, column) of flat positions `flat` (int64) inside part `part` of `parts`.
std::pair<at::Tensor, at::Tensor> FullCoordinates(const Grid& grid, int parts, int part,
                                                  const at::Tensor& flat) {
  const auto [part_rows, part_columns] = grid.PartShape(parts);
  at::Tensor row = flat.div(part_columns, "floor");
  at::Tensor column = flat.remainder(part_columns);
  if (grid.dim == 0)
    row = row + part * part_rows;
  else
    column = column + part * part_columns;
  return {row, column};
}

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

// The elements training rank `source` sends to rollout rank `destination` for one parameter:
// positions in the source's shard and in the destination's slice (flat), in the same order.
std::pair<at::Tensor, at::Tensor> Piece(const ShardedParameter& p, const TrainLayout& train,
                                        const RolloutLayout& rollout, int source, int destination) {
  const Grid grid = Grid::Of(p);
  const int train_parts = Parts(p, train.tp), rollout_parts = Parts(p, rollout.tp);
  const int t = train_parts == 1 ? 0 : source % train.tp, d = source / train.tp;
  // A replicated parameter's single part is sharded over all W ranks' dp index only when
  // tp = 1; with tp > 1 every tp rank holds the same shards: source only from tp rank 0.
  if (train_parts == 1 && train.tp > 1 && source % train.tp != 0) return {};
  const int j = rollout_parts == 1 ? 0 : destination % rollout.tp;
  const auto [begin, end] = ShardRange(grid, train_parts, train.dp, d);
  if (begin >= end) return {};
  const at::Tensor flat = at::arange(begin, end, at::kLong);
  auto [row, column] = FullCoordinates(grid, train_parts, t, flat);
  // Keep what falls in rollout part j, and locate it there.
  const auto [slice_rows, slice_columns] = grid.PartShape(rollout_parts);
  at::Tensor local_row = row, local_column = column;
  at::Tensor inside;
  if (grid.dim == 0) {
    local_row = row - j * slice_rows;
    inside = (local_row >= 0).logical_and(local_row < slice_rows);
  } else {
    local_column = column - j * slice_columns;
    inside = (local_column >= 0).logical_and(local_column < slice_columns);
  }
  const at::Tensor keep = inside.nonzero().view({-1});
  if (keep.numel() == 0) return {};
  return {(flat - begin).index_select(0, keep),
          (local_row * slice_columns + local_column).index_select(0, keep)};
}

}  // namespace

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
                                                const RolloutLayout& rollout) {
  const int size = world.size(), me = world.rank();
  if (train.dp * train.tp != size || rollout.tp * rollout.dp != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("reshard: train dp ", train.dp, " x tp ", train.tp, " and rollout tp ",
                     rollout.tp, " x dp ", rollout.dp, " must both equal the ", size, " ranks"));
  }
  if (train_shards.size() != parameters.size()) {
    return absl::InvalidArgumentError("reshard: one training shard per parameter");
  }
  // One buffer per peer and direction for the whole bucket: parameters in order, each piece's
  // elements in the order Piece() lists them (both sides compute the same lists).
  std::vector<std::vector<at::Tensor>> outgoing(size);
  std::vector<std::vector<std::pair<size_t, at::Tensor>>> incoming(size);  // (parameter, positions)
  std::vector<at::Tensor> slices;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const ShardedParameter& p = parameters[i];
    const Grid grid = Grid::Of(p);
    RETURN_IF_ERROR(CheckDivisible(p, grid, Parts(p, train.tp)));
    RETURN_IF_ERROR(CheckDivisible(p, grid, Parts(p, rollout.tp)));
    const auto [rows, columns] = grid.PartShape(Parts(p, rollout.tp));
    slices.push_back(at::empty({rows * columns}, train_shards[i].options()));
    for (int peer = 0; peer < size; ++peer) {
      const auto [send_from, unused] = Piece(p, train, rollout, me, peer);
      if (send_from.defined()) {
        outgoing[peer].push_back(
            train_shards[i].index_select(0, send_from.to(train_shards[i].device())));
      }
      const auto [unused_from, land_at] = Piece(p, train, rollout, peer, me);
      if (land_at.defined()) incoming[peer].emplace_back(i, land_at);
    }
  }
  std::vector<PeerTransfer> transfers;
  std::vector<at::Tensor> received(size);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == me) continue;
    if (!outgoing[peer].empty()) {
      transfers.push_back({PeerTransfer::Direction::kSend, peer, at::cat(outgoing[peer])});
    }
    int64_t count = 0;
    for (const auto& [unused, positions] : incoming[peer]) count += positions.numel();
    if (count > 0) {
      received[peer] = at::empty(
          {count}, train_shards.empty() ? at::TensorOptions() : train_shards[0].options());
      transfers.push_back({PeerTransfer::Direction::kRecv, peer, received[peer]});
    }
  }
  RETURN_IF_ERROR(world.SendRecv(transfers));
  for (int peer = 0; peer < size; ++peer) {
    // Our own pieces come from our own shard, not the network.
    const at::Tensor source =
        peer == me ? (outgoing[me].empty() ? at::Tensor() : at::cat(outgoing[me])) : received[peer];
    int64_t offset = 0;
    for (const auto& [i, positions] : incoming[peer]) {
      const int64_t n = positions.numel();
      slices[i].index_copy_(0, positions.to(slices[i].device()), source.narrow(0, offset, n));
      offset += n;
    }
  }
  for (size_t i = 0; i < parameters.size(); ++i) {
    std::vector<int64_t> shape = parameters[i].shape;
    if (parameters[i].tp_dim >= 0) shape[parameters[i].tp_dim] /= Parts(parameters[i], rollout.tp);
    slices[i] = slices[i].view(shape);
  }
  return slices;
}

}  // namespace rlhfd::parallel
