// How a batch's rows are split over a pool's data-parallel ranks, the same everywhere (the
// driver splitting prompts, workers placing rows, transfer plans): contiguous parts whose sizes
// differ by at most one, rank k of d holding [ceil(k·n/d), ceil((k+1)·n/d)).
#pragma once

#include <cstdint>

namespace rlhfd {

struct RowRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

inline RowRange ContiguousPart(int64_t rows, int64_t part, int64_t parts) {
  return {(part * rows + parts - 1) / parts, ((part + 1) * rows + parts - 1) / parts};
}

// The part that holds `row`.
inline int64_t PartOfRow(int64_t rows, int64_t row, int64_t parts) { return row * parts / rows; }

}  // namespace rlhfd
