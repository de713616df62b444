// The geometry of a reshard (reshard.h): where each element of a parameter lives in the
// training layout (its shard on each rank) and in the rollout layout (its slice on each rank), and
// the rectangles that move between them. Range arithmetic only: no tensor is touched. Used by
// ReshardPlan and by the helpers that cut shards and slices directly.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "worker/parallel/reshard.h"

namespace rlhfd::parallel::reshard_geometry {

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

int Parts(const ShardedParameter& p, int tp);
// The flat positions [begin, end) of part `t`'s padded flattening that training rank (d, t)
// holds, clipped to the part's real elements (or the parameter's own train_ranges).
std::pair<int64_t, int64_t> ShardRange(const ShardedParameter& p, const Grid& grid, int parts,
                                       int dp, int d);
absl::Status CheckDivisible(const ShardedParameter& p, const Grid& grid, int parts);
// Explicit training ranges: training tp 1, one per data-parallel rank, in order, covering the
// parameter exactly.
absl::Status CheckTrainRanges(const ShardedParameter& p, const Grid& grid,
                              const TrainLayout& train);
// The blocks training rank `source` sends to rollout rank `destination` for one piece, in an
// order both sides compute alike.
std::vector<Block> Blocks(const ShardedParameter& p, const Piece& piece, const TrainLayout& train,
                          const RolloutLayout& rollout, int source, int destination);
// Where this rank's whole slice of `p` is one run of its own shard, the span's start in the
// shard, in elements; else -1.
int64_t SliceInOwnShard(const ShardedParameter& p, const TrainLayout& train,
                        const RolloutLayout& rollout, int me, int size);

}  // namespace rlhfd::parallel::reshard_geometry
