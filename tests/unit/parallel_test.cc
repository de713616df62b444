// The socket communicator across real processes on loopback: every collective against a
// reference with 2 and 4 ranks, and a rank that hangs or exits surfacing as an error on all the
// others within the timeout.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <memory>

#include "absl/strings/str_cat.h"
#include "tests/support/subprocess.h"
#include "worker/parallel/transfer.h"

namespace rlhfd::parallel {
namespace {

struct Ranks {
  testing::TempDir dir;
  std::vector<std::unique_ptr<testing::Subprocess>> processes;
};

std::unique_ptr<Ranks> StartRanks(int size, const std::string& scenario, int timeout_ms) {
  auto ranks = std::make_unique<Ranks>();
  const std::string master = absl::StrCat("127.0.0.1:", testing::FreeLoopbackPort());
  for (int rank = 0; rank < size; ++rank) {
    ranks->processes.push_back(std::make_unique<testing::Subprocess>(
        std::vector<std::string>{RLHFD_COLLECTIVE_WORKER, absl::StrCat("--rank=", rank),
                                 absl::StrCat("--size=", size), "--master=" + master,
                                 "--scenario=" + scenario,
                                 absl::StrCat("--timeout_ms=", timeout_ms)},
        absl::StrCat(ranks->dir.path(), "/rank", rank, ".log")));
  }
  return ranks;
}

// Starts `size` ranks of `scenario` and checks each exits 0 (the worker checks the scenario).
void ExpectAllRanksPass(int size, const std::string& scenario) {
  auto ranks = StartRanks(size, scenario, 20000);
  for (int rank = 0; rank < size; ++rank) {
    // A bound for a hung rank, not a speed check: four ranks of the tensor-parallel scenario on
    // a loaded 2-core machine took over a minute.
    const auto status = ranks->processes[rank]->Wait(absl::Seconds(300));
    INFO(scenario << ", rank " << rank << " of " << size << ", log:\n"
                  << ranks->processes[rank]->ReadLog());
    REQUIRE(status.has_value());
    CHECK(*status == 0);
  }
}

}  // namespace

TEST_CASE("socket communicator: every collective against a reference, 2 and 4 ranks",
          "[parallel]") {
  const int size = GENERATE(2, 4);
  ExpectAllRanksPass(size, "collectives");
}

TEST_CASE("host staging: every operation into and out of strided views, 2 and 3 ranks",
          "[parallel]") {
  const int size = GENERATE(2, 3);
  ExpectAllRanksPass(size, "staged_views");
}

TEST_CASE("cross-pool transfers deliver every row exactly once, 2 and 4 ranks", "[parallel]") {
  const int size = GENERATE(2, 4);
  ExpectAllRanksPass(size, "transfer");
}

TEST_CASE("reshard equals a direct slice of the full weights, every layout pair of 2 and 4 ranks",
          "[parallel]") {
  const int size = GENERATE(2, 4);
  ExpectAllRanksPass(size, "reshard");
}

TEST_CASE(
    "reshard from training ranks to other ranks (a rollout pool of its own) equals a direct "
    "slice",
    "[parallel]") {
  const int size = GENERATE(2, 3, 4);
  ExpectAllRanksPass(size, "reshard_pools");
}

TEST_CASE("ZeRO-2 and ZeRO-3 training over 2 and 4 ranks equal single-process training",
          "[parallel]") {
  const int size = GENERATE(2, 4);
  const std::string scenario = GENERATE("zero2", "zero3");
  ExpectAllRanksPass(size, scenario);
}

TEST_CASE("tensor parallelism (tp = 2, fed by reshard) equals tp = 1: forward, log-probs, greedy",
          "[parallel]") {
  const int size = GENERATE(2, 4);
  ExpectAllRanksPass(size, "tensor_parallel");
}

TEST_CASE("transfer plans: contiguous DP splits", "[parallel]") {
  const TransferPlan plan = TransferPlan::Contiguous(10, {0, 1}, {2, 3, 4});
  CHECK(plan.SourceRows(0) == std::vector<int64_t>{0, 1, 2, 3, 4});
  CHECK(plan.SourceRows(1) == std::vector<int64_t>{5, 6, 7, 8, 9});
  CHECK(plan.DestinationRows(2) == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(plan.DestinationRows(3) == std::vector<int64_t>{4, 5, 6});
  CHECK(plan.DestinationRows(4) == std::vector<int64_t>{7, 8, 9});
  CHECK(plan.DestinationRows(0).empty());
}

TEST_CASE("a rank that hangs or exits becomes an error on every other rank in time", "[parallel]") {
  const std::string scenario = GENERATE("hang", "exit");
  INFO(scenario);
  const int timeout_ms = 2000;
  auto ranks = StartRanks(3, scenario, timeout_ms);
  // Ranks 0 and 2 return within the timeout (+ rendezvous and start-up), with the error checked
  // inside the worker; rank 1 hangs (killed here) or exits.
  for (int rank : {0, 2}) {
    const auto status = ranks->processes[rank]->Wait(absl::Seconds(15));
    INFO("rank " << rank << " log:\n" << ranks->processes[rank]->ReadLog());
    REQUIRE(status.has_value());
    CHECK(*status == 0);
  }
  ranks->processes[1]->Stop(SIGKILL, absl::Seconds(5));
}

}  // namespace rlhfd::parallel
