// A communicator for device tensors over a host-only backend: every tensor that is not a
// contiguous CPU tensor is copied to host memory, the operation runs there, and what it received
// is copied back. Workers that share a GPU run their collectives this way over the socket
// backend (NCCL refuses two ranks on one device): correct and slow, for tests and small jobs on
// one GPU, never the multi-GPU path.
#pragma once

#include <memory>

#include "worker/parallel/communicator.h"

namespace rlhfd::parallel {

std::unique_ptr<Communicator> StageThroughHost(std::unique_ptr<Communicator> host_only);

}  // namespace rlhfd::parallel
