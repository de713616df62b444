// Starts the ranks of a collective_worker scenario (tests/parallel/collective_worker.cc) as
// processes logging into `dir`, with `extra` flags. Set RLHFD_COLLECTIVE_WORKER to run a bundled
// worker binary.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/support/subprocess.h"

namespace rlhfd::parallel {

inline std::vector<std::unique_ptr<testing::Subprocess>> StartRanks(
    const testing::TempDir& dir, const std::string& scenario, int size, int timeout_ms,
    const std::string& backend, const std::vector<std::string>& extra = {}) {
  const char* env = std::getenv("RLHFD_COLLECTIVE_WORKER");
  const std::string worker = env != nullptr ? env : RLHFD_COLLECTIVE_WORKER;
  const std::string master = absl::StrCat("127.0.0.1:", testing::FreeLoopbackPort());
  std::vector<std::unique_ptr<testing::Subprocess>> ranks;
  for (int rank = 0; rank < size; ++rank) {
    std::vector<std::string> command = {worker,
                                        absl::StrCat("--rank=", rank),
                                        absl::StrCat("--size=", size),
                                        "--master=" + master,
                                        "--scenario=" + scenario,
                                        "--backend=" + backend,
                                        absl::StrCat("--timeout_ms=", timeout_ms)};
    command.insert(command.end(), extra.begin(), extra.end());
    ranks.push_back(std::make_unique<testing::Subprocess>(
        command, absl::StrCat(dir.path(), "/", scenario, rank, ".log")));
  }
  return ranks;
}

}  // namespace rlhfd::parallel
