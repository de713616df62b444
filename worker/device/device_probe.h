// Finds the device a worker serves and what it offers: a CUDA GPU when one is present and
// requested, else the host's CPU and memory.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "rlhfd/v1/cluster_service.pb.h"

namespace rlhfd::worker {

// `device` is "auto" (GPU `gpu_index` if CUDA sees it, else CPU), "cpu", or "cuda:N".
// INVALID_ARGUMENT for a malformed spec; NOT_FOUND for a GPU this host does not have.
absl::StatusOr<v1::WorkerCapacity> ProbeDevice(const std::string& device, int gpu_index);

// Free memory of the probed device now (device memory for CUDA, available host memory for CPU);
// -1 when it cannot be read.
int64_t FreeDeviceMemory(const v1::WorkerCapacity& capacity);

// Number of CUDA devices this process can use; 0 without CUDA or without a driver.
int CudaDeviceCount();

}  // namespace rlhfd::worker
