// The data plane's collective interface. Two backends: NCCL (nccl_communicator.h) for GPUs and
// sockets (socket_communicator.h) for CPU-only runs and tests. Every rank of a communicator calls
// each operation in the same order with matching shapes.
//
// Failure model: every operation returns within the communicator's timeout. A peer that died or
// stopped responding makes the operation fail on every live rank (DEADLINE_EXCEEDED when nothing
// arrived in time, UNAVAILABLE when a peer closed its connections); the communicator is then
// aborted and refuses further calls (FAILED_PRECONDITION), so a hang becomes an error instead of
// a stuck cluster.
#pragma once

#include <ATen/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace rlhfd::parallel {

enum class ReduceOp { kSum, kAvg, kMax, kMin };

// How often an operation waiting for its peers looks at the communicator's interrupt flag (set
// when the job's attempt ends: EndJob), so that ending a job never waits out the collective
// timeout on a rank whose peers have given up.
inline constexpr std::chrono::milliseconds kInterruptCheck{100};

// The error an interrupted operation (`what`) returns.
inline absl::Status InterruptedError(absl::string_view what) {
  return absl::CancelledError(
      absl::StrCat(what, ": the job's attempt was ended while it waited for its peers"));
}

// One side of a point-to-point transfer in a grouped SendRecv.
struct PeerTransfer {
  enum class Direction { kSend, kRecv };
  Direction direction;
  int peer;
  at::Tensor tensor;  // Received into in place.
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place on `tensor`.
  virtual absl::Status AllReduce(const at::Tensor& tensor, ReduceOp op) = 0;
  // output (size · n, ...) receives every rank's input (n, ...) in rank order.
  virtual absl::Status AllGather(const at::Tensor& input, const at::Tensor& output) = 0;
  // input (size · n, ...): rank r gets the reduction of every rank's r-th slice in output (n, ...).
  virtual absl::Status ReduceScatter(const at::Tensor& input, const at::Tensor& output,
                                     ReduceOp op) = 0;
  // In place: every rank ends with the root's tensor.
  virtual absl::Status Broadcast(const at::Tensor& tensor, int root) = 0;
  virtual absl::Status Send(const at::Tensor& tensor, int peer) = 0;
  virtual absl::Status Recv(const at::Tensor& tensor, int peer) = 0;
  // Sends and receives that progress together, so their order cannot deadlock (an all-to-all is
  // one call). Transfers to the same peer arrive in the order given.
  virtual absl::Status SendRecv(const std::vector<PeerTransfer>& transfers) = 0;
  // SendRecv that returns once the transfers are queued on the device's current stream instead
  // of waiting for them (NCCL), so the host can queue more work behind them: later work on that
  // stream sees their results. Synchronize() waits for everything queued, within the timeout;
  // the tensors must stay valid until the stream reaches the transfers (memory freed to the
  // caching allocator is, for later work on the same stream). Backends without streams
  // complete the transfers before returning. `meanwhile` (may be empty) runs on this thread
  // while the transfers are being queued (a non-blocking NCCL communicator queues them from a
  // thread of its own, which takes a while); it must not use this communicator.
  virtual absl::Status SendRecvQueued(const std::vector<PeerTransfer>& transfers,
                                      const std::function<void()>& meanwhile) {
    absl::Status status = SendRecv(transfers);
    if (status.ok() && meanwhile) meanwhile();
    return status;
  }
  virtual absl::Status Synchronize() { return absl::OkStatus(); }
  // AllReduce and AllGather that, like SendRecvQueued, return once queued on the device's current
  // stream (NCCL), so that a decode step queues its kernels and collectives without a host wait
  // between them; Synchronize() waits. Backends without streams complete them before returning.
  virtual absl::Status AllReduceQueued(const at::Tensor& tensor, ReduceOp op) {
    return AllReduce(tensor, op);
  }
  virtual absl::Status AllGatherQueued(const at::Tensor& input, const at::Tensor& output) {
    return AllGather(input, output);
  }
  // Whether the queued operations can be captured into a CUDA graph (they run on the stream the
  // graph captures: NCCL), rather than on the host.
  virtual bool CapturableInGraphs() const { return false; }
  virtual absl::Status Barrier() = 0;
  // Ranks passing the same color form a new communicator, ranked by (key, rank). A negative
  // color joins none (the result is null). Every rank must call it.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) = 0;
};

}  // namespace rlhfd::parallel
