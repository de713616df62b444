#include "worker/parallel/reshard_geometry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace rlhfd::parallel::reshard_geometry {

int Parts(const ShardedParameter& p, int tp) { return p.tp_dim < 0 ? 1 : tp; }

// The flat positions [begin, end) of part `t`'s padded flattening that training rank (d, t)
// holds, clipped to the part's real elements (or the parameter's own train_ranges).
std::pair<int64_t, int64_t> ShardRange(const ShardedParameter& p, const Grid& grid, int parts,
                                       int dp, int d) {
  if (!p.train_ranges.empty()) return p.train_ranges[d];
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
  const auto [begin, end] = ShardRange(p, grid, train_parts, train.dp, d);
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

// Explicit training ranges: training tp 1, one per data-parallel rank, in order, covering the
// parameter exactly.
absl::Status CheckTrainRanges(const ShardedParameter& p, const Grid& grid,
                              const TrainLayout& train) {
  if (p.train_ranges.empty()) return absl::OkStatus();
  if (train.tp != 1 || p.train_ranges.size() != static_cast<size_t>(train.dp)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reshard: parameter ", p.name,
                     ": train_ranges need training tp 1 and one range per dp rank"));
  }
  int64_t covered = 0;
  for (const auto& [begin, end] : p.train_ranges) {
    if (begin > end || end > grid.numel() || (begin < end && begin != covered)) {
      return absl::InvalidArgumentError(absl::StrCat("reshard: parameter ", p.name,
                                                     ": train_ranges must partition its ",
                                                     grid.numel(), " elements in rank order"));
    }
    if (begin < end) covered = end;
  }
  if (covered != grid.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reshard: parameter ", p.name, ": train_ranges cover ", covered, " of ", grid.numel()));
  }
  return absl::OkStatus();
}

// Where this rank's whole slice of `p` is one run of its own shard (nothing to receive, one
// stride-free span), the span's start in the shard, in elements; else -1. The slice can then be a
// view of the shard: the layouts coincide there (column-parallel weights from dp = tp_g shards).
int64_t SliceInOwnShard(const ShardedParameter& p, const TrainLayout& train,
                        const RolloutLayout& rollout, int me, int size) {
  const Grid grid = Grid::Of(p);
  const Piece whole{0, 0, grid.rows};
  for (int peer = 0; peer < size; ++peer) {
    if (peer != me && !Blocks(p, whole, train, rollout, peer, me).empty()) return -1;
  }
  const auto [rows, columns] = grid.PartShape(Parts(p, rollout.tp));
  int64_t start = -1, covered = 0;
  for (const Block& b : Blocks(p, whole, train, rollout, me, me)) {
    const bool contiguous =
        b.rows == 1 || (b.source_stride == b.columns && b.destination_stride == b.columns);
    const int64_t delta = b.source_offset - b.destination_offset;
    if (!contiguous || delta < 0 || (start >= 0 && delta != start)) return -1;
    start = delta;
    covered += b.numel();
  }
  return covered == rows * columns ? start : -1;
}

}  // namespace rlhfd::parallel::reshard_geometry
