#include "worker/device/device_memory.h"

#include <ATen/ATen.h>
#include <malloc.h>

#if RLHFD_HAVE_CUDA
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace rlhfd::worker {
namespace {

int64_t HostHeapInUse() {
  const struct mallinfo2 heap = ::mallinfo2();
  return static_cast<int64_t>(heap.uordblks + heap.hblkhd);
}

}  // namespace

#if RLHFD_HAVE_CUDA

// The caching allocator's statistics need CUDA initialised (a worker asks before its first
// allocation: the allocator then has no devices yet and refuses every index).
c10::DeviceIndex CudaIndexOf(const at::Device& device) {
  at::globalContext().lazyInitDevice(at::kCUDA);
  return device.has_index() ? device.index() : c10::cuda::current_device();
}

DeviceMemory QueryDeviceMemory(const at::Device& device) {
  if (!device.is_cuda()) return {};
  const c10::DeviceIndex index = CudaIndexOf(device);
  c10::cuda::CUDAGuard guard(index);
  size_t free = 0, total = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  constexpr auto kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  DeviceMemory memory;
  memory.total_bytes = static_cast<int64_t>(total);
  memory.allocated_bytes = stats.allocated_bytes[kAll].current;
  memory.peak_allocated_bytes = stats.allocated_bytes[kAll].peak;
  memory.reserved_bytes = stats.reserved_bytes[kAll].current;
  memory.peak_reserved_bytes = stats.reserved_bytes[kAll].peak;
  memory.free_bytes = static_cast<int64_t>(free) + memory.reserved_bytes - memory.allocated_bytes;
  return memory;
}

int64_t BytesInUse(const at::Device& device) {
  return device.is_cuda() ? QueryDeviceMemory(device).allocated_bytes : HostHeapInUse();
}

void ResetPeakMemory(const at::Device& device) {
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(CudaIndexOf(device));
}

void ReleaseCachedMemory(const at::Device& device) {
  if (!device.is_cuda()) return;
  // cuBLAS keeps a workspace per (handle, stream), ours among them; they come back on next use.
  at::cuda::clearCublasWorkspaces();
  c10::cuda::CUDACachingAllocator::emptyCache();
}

#else  // No CUDA: CPU devices only.

DeviceMemory QueryDeviceMemory(const at::Device&) { return {}; }
int64_t BytesInUse(const at::Device&) { return HostHeapInUse(); }
void ResetPeakMemory(const at::Device&) {}
void ReleaseCachedMemory(const at::Device&) {}

#endif

}  // namespace rlhfd::worker
