// [gpu] The NCCL communicator across processes, one GPU each: the equality tests of
// tests/unit/parallel_test.cc (collectives, transfers, reshard, ZeRO-2/3, tensor parallelism)
// over NCCL, and a rank that stops responding surfacing as a timeout on the other. Every
// scenario needs two ranks: with one GPU, one rank checks that NCCL starts and runs its
// collectives, and the scenarios are reported skipped (exit 77), never passed. Set
// RLHFD_COLLECTIVE_WORKER to run a bundled worker binary.
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <memory>

#include "tests/gpu/collective_ranks.h"
#include "tests/support/gpu_skip.h"

namespace rlhfd::parallel {

TEST_CASE("NCCL communicator: collectives on every GPU (up to two), and a hung rank times out",
          "[gpu][parallel]") {
  const int size = std::min<int>(2, static_cast<int>(torch::cuda::device_count()));
  testing::TempDir dir;
  std::vector<std::string> scenarios = {"collectives",     "transfer",   "reshard",
                                        "reshard_pools",   "zero2",      "zero3",
                                        "tensor_parallel", "tp_generate"};
  // One rank: NCCL starts and runs its collectives, and the tensor-parallel decode runs over it
  // at tp 1 (its collectives queued and captured in the CUDA graphs).
  if (size < 2) scenarios = {"collectives", "tp_generate"};
  for (const std::string& scenario : scenarios) {
    auto ranks = StartRanks(dir, scenario, size, 60000, "nccl");
    for (int rank = 0; rank < size; ++rank) {
      const auto status = ranks[rank]->Wait(absl::Seconds(120));
      const std::string log = ranks[rank]->ReadLog();
      std::cout << "nccl_test " << scenario << ", " << size << " rank(s), rank " << rank
                << ": exit " << (status ? *status : -1) << "\n"
                << log;
      INFO(scenario << ": " << log);
      REQUIRE(status.has_value());
      CHECK(*status == 0);
    }
  }
  if (size < 2) {
    testing::ReportSkipped(
        "one GPU: the two-rank scenarios over NCCL (collectives, transfer, reshard, zero2, "
        "zero3, tensor_parallel, tp_generate at tp 2, hang) need two GPUs; one rank ran the "
        "collectives and tp_generate at tp 1 (shared_gpu_test runs tp 2 on one GPU over "
        "sockets)");
    return;
  }
  const int timeout_ms = 5000;
  auto ranks = StartRanks(dir, "hang", 2, timeout_ms, "nccl");
  const auto status = ranks[0]->Wait(absl::Seconds(60));
  const std::string log = ranks[0]->ReadLog();
  std::cout << "nccl_test hang rank 0:\n" << log;
  INFO(log);
  REQUIRE(status.has_value());
  CHECK(*status == 0);  // The worker checked: DEADLINE_EXCEEDED within the timeout + 1 s.
  ranks[1]->Stop(SIGKILL, absl::Seconds(5));
}

}  // namespace rlhfd::parallel
