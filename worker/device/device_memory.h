// Memory figures of the device a worker computes on: the GPU's free memory with what the CUDA
// caching allocator holds unused, the allocator's statistics, and the host heap for a CPU device.
// The one place that measures them, for the generation engine's cache budget, the roles' memory
// reports and the trainer's choice to keep logits for the backward.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>

namespace rlhfd::worker {

struct DeviceMemory {
  int64_t free_bytes = 0;       // Free on the device plus what our allocator caches unused.
  int64_t total_bytes = 0;      // The device's memory.
  int64_t allocated_bytes = 0;  // Held by live tensors.
  int64_t peak_allocated_bytes = 0;
  int64_t reserved_bytes = 0;  // Allocated plus cached.
  int64_t peak_reserved_bytes = 0;
};

// All zero for a CPU device. "cuda" without an index is the current device.
DeviceMemory QueryDeviceMemory(const at::Device& device);
// Bytes the process's tensors on `device` hold now: the CUDA caching allocator's allocated bytes
// on a GPU, the heap's bytes in use (glibc's mallinfo2, mapped blocks included) on the CPU.
int64_t BytesInUse(const at::Device& device);
void ResetPeakMemory(const at::Device& device);
// The CUDA device's index with CUDA initialised (a worker may ask before anything has touched the
// GPU): "cuda" without an index is the current device. CUDA builds only.
c10::DeviceIndex CudaIndexOf(const at::Device& device);
// Returns the allocator's cached blocks (and cuBLAS's workspaces) to the driver.
void ReleaseCachedMemory(const at::Device& device);

}  // namespace rlhfd::worker
