// Device discovery through the CUDA runtime (linked statically, so the same binary runs on hosts
// without a driver) and /proc for CPU workers.
#include "absl/strings/string_view.h"
#include "worker/device/device_probe.h"

#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

#if RLHFD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace rlhfd::worker {
namespace {

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

// Reads "Key:   12345 kB" from /proc/meminfo, in bytes; -1 when absent.
int64_t MeminfoBytes(const std::string& key) {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (!absl::StartsWith(line, key + ":")) continue;
    absl::string_view value = absl::StripAsciiWhitespace(absl::string_view(line).substr(key.size() + 1));
    absl::ConsumeSuffix(&value, " kB");
    int64_t kib = 0;
    if (absl::SimpleAtoi(value, &kib)) return kib * 1024;
  }
  return -1;
}

std::string CpuModel() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (absl::StartsWith(line, "model name")) {
      auto colon = line.find(':');
      if (colon != std::string::npos) {
        return std::string(absl::StripAsciiWhitespace(absl::string_view(line).substr(colon + 1)));
      }
    }
  }
  return "CPU";
}

v1::WorkerCapacity CpuCapacity() {
  v1::WorkerCapacity capacity;
  capacity.set_host(HostName());
  capacity.set_device_kind(v1::DEVICE_KIND_CPU);
  capacity.set_device_index(-1);
  capacity.set_device_name(CpuModel());
  capacity.set_memory_total_bytes(MeminfoBytes("MemTotal"));
  capacity.set_memory_free_bytes(MeminfoBytes("MemAvailable"));
  return capacity;
}

absl::StatusOr<v1::WorkerCapacity> CudaCapacity(int index) {
#if RLHFD_HAVE_CUDA
  const int count = CudaDeviceCount();
  if (index < 0 || index >= count) {
    return absl::NotFoundError(absl::StrCat("GPU ", index, " requested but CUDA sees ", count,
                                            " device(s); check --device/--gpu_index and "
                                            "CUDA_VISIBLE_DEVICES"));
  }
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, index) != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cannot read the properties of GPU ", index));
  }
  v1::WorkerCapacity capacity;
  capacity.set_host(HostName());
  capacity.set_device_kind(v1::DEVICE_KIND_CUDA);
  capacity.set_device_index(index);
  capacity.set_device_name(properties.name);
  capacity.set_compute_capability(absl::StrCat(properties.major, ".", properties.minor));
  capacity.set_memory_total_bytes(static_cast<int64_t>(properties.totalGlobalMem));
  capacity.set_memory_free_bytes(FreeDeviceMemory(capacity));
  return capacity;
#else
  return absl::FailedPreconditionError(
      "this rlhfd-worker was built without CUDA; use --device=cpu or rebuild with the CUDA "
      "toolkit present");
#endif
}

}  // namespace

int CudaDeviceCount() {
#if RLHFD_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // No driver or no device: clear the sticky error, report none.
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

absl::StatusOr<v1::WorkerCapacity> ProbeDevice(const std::string& device, int gpu_index) {
  if (device == "cpu") return CpuCapacity();
  if (device == "auto") {
    return CudaDeviceCount() > gpu_index ? CudaCapacity(gpu_index) : CpuCapacity();
  }
  absl::string_view rest = device;
  int index = 0;
  if (absl::ConsumePrefix(&rest, "cuda:") && absl::SimpleAtoi(rest, &index) && index >= 0) {
    return CudaCapacity(index);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device='", device, "' is not one of: auto, cpu, cuda:N"));
}

int64_t FreeDeviceMemory(const v1::WorkerCapacity& capacity) {
#if RLHFD_HAVE_CUDA
  if (capacity.device_kind() == v1::DEVICE_KIND_CUDA) {
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaSetDevice(capacity.device_index()) != cudaSuccess ||
        cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    return static_cast<int64_t>(free_bytes);
  }
#endif
  return MeminfoBytes("MemAvailable");
}

}  // namespace rlhfd::worker
