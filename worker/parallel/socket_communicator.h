// The CPU backend of Communicator: a full mesh of TCP connections between the ranks, with every
// collective a set of concurrent sends and receives driven by poll() against one deadline.
// Meant for tests, CPU-only runs and small control data; its all-to-all algorithms send
// O(size²) messages and it is not for scale (NCCL is the production path).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/parallel/communicator.h"

namespace rlhfd::parallel {

struct SocketOptions {
  std::string master = "127.0.0.1:29500";    // host:port rank 0 listens on for the rendezvous
  std::chrono::milliseconds timeout{30000};  // for the rendezvous and for every operation
};

// Blocks until all `size` ranks have joined (or the timeout passes). Tensors must be CPU and
// contiguous.
absl::StatusOr<std::unique_ptr<Communicator>> CreateSocketCommunicator(
    int rank, int size, const SocketOptions& options);

}  // namespace rlhfd::parallel
