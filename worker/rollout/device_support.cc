#include "worker/rollout/device_support.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "worker/device/device_memory.h"
#if RLHFD_HAVE_CUDA
#include <ATen/cuda/CUDAContextLight.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace rlhfd::rollout {

#if RLHFD_HAVE_CUDA

std::string DeviceName(const at::Device& device) {
  if (!device.is_cuda()) return "CPU";
  return at::cuda::getDeviceProperties(device.index())->name;
}

int64_t DeviceIdentity(const at::Device& device) {
  if (!device.is_cuda()) return -1;
  const cudaUUID_t& uuid = at::cuda::getDeviceProperties(worker::CudaIndexOf(device))->uuid;
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the 16 bytes
  for (const char byte : uuid.bytes) {
    hash = (hash ^ static_cast<uint8_t>(byte)) * 1099511628211ull;
  }
  return static_cast<int64_t>(hash >> 1);
}

void Synchronize(const at::Device& device) {
  if (device.is_cuda()) c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
}

struct StreamMarker::Event {
  at::cuda::CUDAEvent event;
};

StreamMarker::StreamMarker(const at::Device& device) {
  if (!device.is_cuda()) return;
  event_ = std::make_unique<Event>();
  event_->event.record(c10::cuda::getCurrentCUDAStream(device.index()));
}

StreamMarker::~StreamMarker() = default;

void StreamMarker::Wait() {
  if (event_) event_->event.synchronize();
}

bool StreamMarker::WaitFor(std::chrono::milliseconds limit) {
  if (!event_) return true;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!event_->event.query()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return true;
}

struct DecodeGraphs::Graphs {
  // The first graph's private pool, shared by the later ones; freed with the last of them.
  std::optional<at::cuda::MempoolId_t> pool;
  // One capture stream for all (each stream would get its own cuBLAS workspace).
  std::optional<c10::cuda::CUDAStream> stream;
  std::vector<int64_t> planned;  // Ascending.
  // batch → (graph, output), the sizes captured so far.
  std::map<int64_t, std::pair<std::unique_ptr<at::cuda::CUDAGraph>, at::Tensor>> by_batch;
};

DecodeGraphs::DecodeGraphs(const at::Device& device)
    : device_(device), graphs_(Available(device) ? std::make_unique<Graphs>() : nullptr) {}

DecodeGraphs::~DecodeGraphs() { Clear(); }

bool DecodeGraphs::Available(const at::Device& device) { return device.is_cuda(); }

void DecodeGraphs::Plan(std::vector<int64_t> sizes) {
  Clear();
  if (!graphs_) return;
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  graphs_->planned = std::move(sizes);
}

void DecodeGraphs::Capture(int64_t batch, const std::function<at::Tensor()>& step) {
  c10::cuda::CUDAGuard device_guard(device_);
  // Capture runs on a side stream; the warm-up there first initialises cuBLAS workspaces and
  // anything else lazy, which capture would not allow. The steps before it must be done: the
  // warm-up writes the same keys and values as the replay after it will, at the same places.
  if (!graphs_->stream) {
    graphs_->stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index());
  }
  c10::cuda::CUDAStream side = *graphs_->stream;
  c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
  c10::cuda::CUDAStreamGuard stream_guard(side);
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  bool capturing = false;
  // A graph's destructor does not end its capture: a failed one is ended here, or the side
  // stream stays in capture mode and the next Generate fails on it too.
  const auto end_failed_capture = [&] {
    if (!capturing) return;
    try {
      graph->capture_end();
    } catch (const c10::Error&) {  // An invalidated capture ends with an error; it has ended.
    }
  };
  try {
    step();
    side.synchronize();
    graph->capture_begin(graphs_->pool.value_or(at::cuda::MempoolId_t{0, 0}));
    capturing = true;
    at::Tensor output = step();
    capturing = false;
    graph->capture_end();
    if (!graphs_->pool) graphs_->pool = graph->pool();
    side.synchronize();
    graphs_->by_batch[batch] = {std::move(graph), std::move(output)};
  } catch (c10::Error& error) {  // Rethrown as it came (an out-of-memory error stays one).
    end_failed_capture();
    error.add_context(absl::StrCat("capturing the decode step for batch ", batch));
    throw;
  } catch (...) {
    end_failed_capture();
    throw;
  }
}

int64_t DecodeGraphs::BucketFor(int64_t rows) const {
  if (!graphs_) return 0;
  auto it = std::lower_bound(graphs_->planned.begin(), graphs_->planned.end(), rows);
  return it == graphs_->planned.end() ? 0 : *it;
}

at::Tensor DecodeGraphs::Replay(int64_t batch, const std::function<at::Tensor()>& step) {
  TORCH_CHECK(
      graphs_ && std::binary_search(graphs_->planned.begin(), graphs_->planned.end(), batch),
      "no CUDA graph is planned for batch ", batch);
  auto captured = graphs_->by_batch.find(batch);
  if (captured == graphs_->by_batch.end()) {
    Capture(batch, step);
    captured = graphs_->by_batch.find(batch);
  }
  auto& [graph, output] = captured->second;
  graph->replay();
  return output;
}

std::vector<int64_t> DecodeGraphs::CapturedSizes() const {
  std::vector<int64_t> sizes;
  if (graphs_) {
    for (const auto& [batch, unused] : graphs_->by_batch) sizes.push_back(batch);
  }
  return sizes;
}

void DecodeGraphs::Clear() {
  if (!graphs_) return;
  graphs_->planned.clear();
  graphs_->by_batch.clear();
  graphs_->pool.reset();
}

bool DecodeGraphs::empty() const { return !graphs_ || graphs_->planned.empty(); }

#else  // No CUDA: CPU devices only.

std::string DeviceName(const at::Device&) { return "CPU"; }
int64_t DeviceIdentity(const at::Device&) { return -1; }
void Synchronize(const at::Device&) {}

struct StreamMarker::Event {};
StreamMarker::StreamMarker(const at::Device&) {}
StreamMarker::~StreamMarker() = default;
void StreamMarker::Wait() {}
bool StreamMarker::WaitFor(std::chrono::milliseconds) { return true; }

struct DecodeGraphs::Graphs {};
DecodeGraphs::DecodeGraphs(const at::Device& device) : device_(device) {}
DecodeGraphs::~DecodeGraphs() = default;
bool DecodeGraphs::Available(const at::Device&) { return false; }
void DecodeGraphs::Plan(std::vector<int64_t>) {}
int64_t DecodeGraphs::BucketFor(int64_t) const { return 0; }
at::Tensor DecodeGraphs::Replay(int64_t batch, const std::function<at::Tensor()>&) {
  TORCH_CHECK(false, "built without CUDA: no CUDA graph for batch ", batch);
}
std::vector<int64_t> DecodeGraphs::CapturedSizes() const { return {}; }
void DecodeGraphs::Clear() {}
bool DecodeGraphs::empty() const { return true; }

#endif

absl::StatusOr<int64_t> RanksOnThisDevice(parallel::Communicator& group, const at::Device& device) {
  const int64_t me = DeviceIdentity(device);
  const auto longs = at::TensorOptions(at::kLong).device(device);
  const at::Tensor identities = at::empty({group.size()}, longs);
  if (absl::Status gathered = group.AllGather(at::full({1}, me, longs), identities);
      !gathered.ok()) {
    return gathered;
  }
  if (me == -1) return 1;  // the host's memory is budgeted apart (EngineOptions::cpu_cache_bytes)
  return std::max<int64_t>(1, identities.eq(me).sum().item<int64_t>());
}

}  // namespace rlhfd::rollout
