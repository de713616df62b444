// Many strided 2-D byte copies in one pass: how Reshard packs a bucket's blocks into one message
// per peer and unpacks what arrives, without a kernel launch (a few microseconds each) per block.
// No LibTorch here, so the CUDA side builds with nvcc alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#ifdef RLHFD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace rlhfd::parallel {

// `rows` runs of `row_bytes` bytes, `source_pitch` apart in the source and `destination_pitch`
// apart in the destination.
struct BlockCopy {
  const std::byte* source = nullptr;
  std::byte* destination = nullptr;
  int64_t rows = 0;
  int64_t row_bytes = 0;
  int64_t source_pitch = 0;
  int64_t destination_pitch = 0;
  // Set by PlanBlockCopies: the widest access (1..16 bytes) every address and length allows,
  // and the copy's first tile in the launch.
  int64_t vector_bytes = 1;
  int64_t first_tile = 0;
};

// Bytes one GPU thread block copies per tile.
inline constexpr int64_t kBlockCopyTileBytes = int64_t{64} << 10;

// Merges rows of copies that are contiguous on both sides, drops empty copies, picks each copy's
// access width and numbers the tiles; returns the total number of tiles.
int64_t PlanBlockCopies(std::vector<BlockCopy>& copies);

// Copies on the host, row by row (the CPU backend's path).
void CopyBlocksOnHost(const std::vector<BlockCopy>& copies);

#ifdef RLHFD_HAVE_CUDA
// One kernel for all `count` planned copies, whose descriptors are in device memory. Returns the
// launch's error.
cudaError_t CopyBlocksOnDevice(const BlockCopy* device_copies, int64_t count, int64_t tiles,
                               cudaStream_t stream);
#endif

}  // namespace rlhfd::parallel
