// The batched block copy (block_copy.h): a grid-stride loop over the tiles of all copies; each
// thread block finds its copy by binary search over the copies' first tiles and moves the tile
// with the widest access the copy allows.
#include <cuda_runtime.h>

#include <algorithm>

#include "worker/parallel/block_copy.h"

namespace rlhfd::parallel {
namespace {

constexpr int kThreads = 256;

template <typename Word>
__device__ void CopyTile(const BlockCopy& copy, std::byte* const* regions, int64_t begin,
                         int64_t end) {
  const int64_t width = sizeof(Word);
  const Word* source =
      reinterpret_cast<const Word*>(regions[copy.source_region] + copy.source_offset);
  Word* destination =
      reinterpret_cast<Word*>(regions[copy.destination_region] + copy.destination_offset);
  if (copy.rows == 1) {
    for (int64_t i = begin / width + threadIdx.x; i < end / width; i += kThreads) {
      destination[i] = source[i];
    }
    return;
  }
  const int64_t row_words = copy.row_bytes / width;
  const int64_t source_pitch = copy.source_pitch / width;
  const int64_t destination_pitch = copy.destination_pitch / width;
  for (int64_t i = begin / width + threadIdx.x; i < end / width; i += kThreads) {
    const int64_t row = i / row_words, column = i - row * row_words;
    destination[row * destination_pitch + column] = source[row * source_pitch + column];
  }
}

__global__ void __launch_bounds__(kThreads)
    CopyBlocksKernel(const BlockCopy* __restrict__ copies, int64_t count, int64_t tiles,
                     std::byte* const* __restrict__ regions, int64_t max_vector_bytes) {
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    // The last copy whose first tile is <= tile.
    int64_t low = 0, high = count - 1;
    while (low < high) {
      const int64_t middle = (low + high + 1) / 2;
      if (copies[middle].first_tile <= tile) {
        low = middle;
      } else {
        high = middle - 1;
      }
    }
    const BlockCopy copy = copies[low];
    const int64_t total = copy.rows * copy.row_bytes;
    const int64_t begin = (tile - copy.first_tile) * kBlockCopyTileBytes;
    const int64_t end = min(total, begin + kBlockCopyTileBytes);
    switch (min(copy.vector_bytes, max_vector_bytes)) {
      case 16:
        CopyTile<uint4>(copy, regions, begin, end);
        break;
      case 8:
        CopyTile<uint2>(copy, regions, begin, end);
        break;
      case 4:
        CopyTile<uint32_t>(copy, regions, begin, end);
        break;
      case 2:
        CopyTile<uint16_t>(copy, regions, begin, end);
        break;
      default:
        CopyTile<uint8_t>(copy, regions, begin, end);
    }
  }
}

}  // namespace

cudaError_t CopyBlocksOnDevice(const BlockCopy* copies, int64_t count, int64_t tiles,
                               std::byte* const* regions, int64_t max_vector_bytes,
                               cudaStream_t stream) {
  if (count == 0 || tiles == 0) return cudaSuccess;
  // Enough blocks to fill the GPU several times over; the loop covers the rest.
  const int64_t grid = std::min<int64_t>(tiles, 4096);
  CopyBlocksKernel<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(copies, count, tiles,
                                                                         regions, max_vector_bytes);
  return cudaGetLastError();
}

}  // namespace rlhfd::parallel
