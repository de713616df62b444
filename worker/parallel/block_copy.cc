#include "worker/parallel/block_copy.h"

#include <cstring>

namespace rlhfd::parallel {

int64_t PlanBlockCopies(std::vector<BlockCopy>& copies) {
  int64_t tiles = 0;
  size_t kept = 0;
  for (BlockCopy copy : copies) {
    if (copy.rows <= 0 || copy.row_bytes <= 0) continue;
    if (copy.source_pitch == copy.row_bytes && copy.destination_pitch == copy.row_bytes) {
      copy.row_bytes *= copy.rows;  // One run of memory on both sides.
      copy.source_pitch = copy.destination_pitch = copy.row_bytes;
      copy.rows = 1;
    }
    const uint64_t alignment = reinterpret_cast<uintptr_t>(copy.source) |
                               reinterpret_cast<uintptr_t>(copy.destination) |
                               static_cast<uint64_t>(copy.row_bytes) |
                               static_cast<uint64_t>(copy.rows > 1 ? copy.source_pitch : 0) |
                               static_cast<uint64_t>(copy.rows > 1 ? copy.destination_pitch : 0);
    copy.vector_bytes = 16;
    while (alignment % copy.vector_bytes != 0) copy.vector_bytes /= 2;
    copy.first_tile = tiles;
    tiles += (copy.rows * copy.row_bytes + kBlockCopyTileBytes - 1) / kBlockCopyTileBytes;
    copies[kept++] = copy;
  }
  copies.resize(kept);
  return tiles;
}

void CopyBlocksOnHost(const std::vector<BlockCopy>& copies) {
  for (const BlockCopy& copy : copies) {
    for (int64_t row = 0; row < copy.rows; ++row) {
      std::memcpy(copy.destination + row * copy.destination_pitch,
                  copy.source + row * copy.source_pitch, copy.row_bytes);
    }
  }
}

}  // namespace rlhfd::parallel
