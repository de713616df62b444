#include "worker/parallel/block_copy.h"

#include <cstring>
#include <span>

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
    const uint64_t alignment = static_cast<uint64_t>(copy.source_offset) |
                               static_cast<uint64_t>(copy.destination_offset) |
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

void CopyBlocksOnHost(const BlockCopy* copies, int64_t count, std::byte* const* regions) {
  for (const BlockCopy& copy : std::span(copies, count)) {
    const std::byte* source = regions[copy.source_region] + copy.source_offset;
    std::byte* destination = regions[copy.destination_region] + copy.destination_offset;
    for (int64_t row = 0; row < copy.rows; ++row) {
      std::memcpy(destination + row * copy.destination_pitch, source + row * copy.source_pitch,
                  copy.row_bytes);
    }
  }
}

}  // namespace rlhfd::parallel
