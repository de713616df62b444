// [gpu] Two ranks on one GPU, as two workers sharing a GPU run: sockets with device tensors staged
// through the host (NCCL refuses two ranks on one device). The collective_worker scenarios'
// equality checks on device tensors (collectives, transfers, reshard, ZeRO-3, the tensor-parallel
// model), and the engine's tensor-parallel fused decode at tp 2 against tp 1 (tp_generate), with
// the committed fixtures through the tensor-parallel forward the actor uses for them.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <iostream>
#include <string>

#include "tests/gpu/collective_ranks.h"

namespace rlhfd::parallel {
namespace {

// The committed model fixtures: RLHFD_FIXTURES_DIR (a bundle on another machine), else this
// checkout's.
std::string FixturesDir() {
  const char* env = std::getenv("RLHFD_FIXTURES_DIR");
  return env != nullptr ? env : RLHFD_FIXTURES_DIR;
}

}  // namespace

TEST_CASE("two ranks sharing a GPU: staged collectives and tensor-parallel generation",
          "[gpu][parallel]") {
  testing::TempDir dir;
  for (const std::string scenario : {"collectives", "transfer", "reshard", "reshard_pools", "zero3",
                                     "tensor_parallel", "tp_generate"}) {
    auto ranks = StartRanks(dir, scenario, 2, 60000, "staged", {"--fixtures_dir=" + FixturesDir()});
    for (int rank = 0; rank < 2; ++rank) {
      const auto status = ranks[rank]->Wait(absl::Seconds(240));
      const std::string log = ranks[rank]->ReadLog();
      std::cout << "shared GPU " << scenario << ", rank " << rank << ": exit "
                << (status ? *status : -1) << "\n"
                << log;
      INFO(scenario << ": " << log);
      REQUIRE(status.has_value());
      CHECK(*status == 0);
    }
  }
}

}  // namespace rlhfd::parallel
