// Many strided 2-D byte copies in one pass: how Reshard packs a bucket's blocks into one message
// per peer, unpacks what arrives and copies the local blocks, without a kernel launch (a few
// microseconds each) per block. Copies address memory as (region, byte offset), so a plan's
// copies are made once and run against whatever tensors hold the regions each time. No LibTorch
// here, so the CUDA side builds with nvcc alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#ifdef RLHFD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace rlhfd::parallel {

// `rows` runs of `row_bytes` bytes, `source_pitch` apart from region `source_region` at
// `source_offset`, to `destination_pitch` apart from `destination_region` at
// `destination_offset`.
struct BlockCopy {
  int32_t source_region = 0;
  int32_t destination_region = 0;
  int64_t source_offset = 0;
  int64_t destination_offset = 0;
  int64_t rows = 0;
  int64_t row_bytes = 0;
  int64_t source_pitch = 0;
  int64_t destination_pitch = 0;
  // Set by PlanBlockCopies: the widest access (1..16 bytes) the offsets and lengths allow (with
  // 16-byte aligned regions), and the copy's first tile in its launch.
  int64_t vector_bytes = 1;
  int64_t first_tile = 0;
};

// Bytes one GPU thread block copies per tile.
inline constexpr int64_t kBlockCopyTileBytes = int64_t{64} << 10;

// Prepares one launch's copies: merges rows that are contiguous on both sides, drops empty
// copies, picks each copy's access width and numbers the tiles; returns the launch's tiles.
int64_t PlanBlockCopies(std::vector<BlockCopy>& copies);

// Copies on the host, row by row (the CPU backend's path). `regions` are the base addresses.
void CopyBlocksOnHost(const BlockCopy* copies, int64_t count, std::byte* const* regions);

#ifdef RLHFD_HAVE_CUDA
// One kernel for `count` planned copies (one launch's, in device memory) over the device array of
// region base addresses. Accesses are at most `max_vector_bytes` wide (16 when every region is
// 16-byte aligned). Returns the launch's error.
cudaError_t CopyBlocksOnDevice(const BlockCopy* copies, int64_t count, int64_t tiles,
                               std::byte* const* regions, int64_t max_vector_bytes,
                               cudaStream_t stream);
#endif

}  // namespace rlhfd::parallel
