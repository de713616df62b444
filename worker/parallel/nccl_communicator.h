// The NCCL backend of Communicator, for GPUs. Operations run on the current CUDA stream of the
// communicator's device and the call waits for them, polling the stream and NCCL's asynchronous
// error state against the timeout; on an error or a timeout the communicator is aborted
// (ncclCommAbort), which also ends a kernel stuck waiting for a dead peer, and the call returns
// the error. (A watchdog thread that lets operations stay asynchronous is future work.)
//
// Communicators are non-blocking NCCL communicators, so initialisation and splits are bounded
// by the same timeout. Keep NCCL_NVLS_ENABLE=0 on machines without NVLink multicast support.
#pragma once

#include <ATen/Device.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/parallel/communicator.h"

namespace rlhfd::parallel {

// A fresh NCCL unique id (its bytes): rank 0 makes one and hands it to the others (through the
// controller, or a bootstrap communicator).
absl::StatusOr<std::string> NewNcclUniqueId();

struct NcclOptions {
  std::chrono::milliseconds timeout{300000};
  // Once set (from any thread), an operation in progress fails (CANCELLED) and the communicator
  // is aborted (ncclCommAbort ends the waiting kernel too): the job's attempt has ended.
  std::shared_ptr<const std::atomic<bool>> interrupt;
};

// Every rank calls it with the same id and size; blocks until all joined or the timeout passes.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(int rank, int size,
                                                                     const std::string& unique_id,
                                                                     const at::Device& device,
                                                                     const NcclOptions& options);

}  // namespace rlhfd::parallel
