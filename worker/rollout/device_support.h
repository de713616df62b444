// The CUDA pieces the generation engine needs, behind an interface that also builds and runs
// without CUDA (where they report nothing and capture nothing): the device's name and identity,
// stream markers and CUDA graphs of the decode step (memory figures:
// worker/device/device_memory.h).
#pragma once

#include <ATen/Tensor.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/parallel/communicator.h"

namespace rlhfd::rollout {

// The name the device reports ("NVIDIA H200"); "CPU" for the host.
std::string DeviceName(const at::Device& device);
// The same number in every process that uses the same GPU (a hash of its UUID), whatever index
// each knows it by; -1 for the host.
int64_t DeviceIdentity(const at::Device& device);
// How many ranks of `group` (this one included) run on this rank's GPU (workers placed on one
// GPU): each sees the same free memory, so each takes that share of it. 1 on the host. Every
// rank of the group calls it together (an all-gather).
absl::StatusOr<int64_t> RanksOnThisDevice(parallel::Communicator& group, const at::Device& device);
void Synchronize(const at::Device& device);

// A point in the current stream's work, recorded on construction; Wait() blocks the host until
// the work before it is done. Immediate on a CPU device.
class StreamMarker {
 public:
  explicit StreamMarker(const at::Device& device);
  ~StreamMarker();
  void Wait();
  // Whether the work before it finished within `limit` (polled; the host does not block longer).
  bool WaitFor(std::chrono::milliseconds limit);

 private:
  struct Event;
  std::unique_ptr<Event> event_;
};

// CUDA graphs of one step function, one per planned batch size, sharing one memory pool. A size
// is captured the first time a step of it runs, not when planned: a generation whose batch stays
// at 512 captures one graph, not the ten of 512 down to 1 (each capture costs a warm-up step and
// about 5 ms of idle GPU, and the engine plans them again after every Release).
class DecodeGraphs {
 public:
  explicit DecodeGraphs(const at::Device& device);
  ~DecodeGraphs();

  static bool Available(const at::Device& device);
  // The batch sizes that get a graph (captured on first use); drops any captured before.
  void Plan(std::vector<int64_t> sizes);
  // The smallest planned batch size >= rows, or 0 when none is.
  int64_t BucketFor(int64_t rows) const;
  // Replays the graph of planned size `batch` on the current stream and returns its output, a
  // tensor in the pool that every replay refills. The first time, `step` (which must compute
  // the graph's work for `batch` rows) is run once to warm up and then captured; a capture that
  // fails throws (c10::Error) with the batch size in its message.
  at::Tensor Replay(int64_t batch, const std::function<at::Tensor()>& step);
  // The sizes captured so far, ascending.
  std::vector<int64_t> CapturedSizes() const;
  void Clear();
  bool empty() const;  // No size planned: the caller runs its steps eagerly.

 private:
  struct Graphs;
  // Warms `step` up and captures it for `batch` rows; throws what it failed with (c10::Error
  // with the batch size added to its context), the capture ended.
  void Capture(int64_t batch, const std::function<at::Tensor()>& step);

  at::Device device_;
  std::unique_ptr<Graphs> graphs_;
};

}  // namespace rlhfd::rollout
