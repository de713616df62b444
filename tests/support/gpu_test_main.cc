// Catch2 main for [gpu] test binaries: without a usable CUDA device it exits 77, which CTest
// reports as "skipped" (SKIP_RETURN_CODE), so CPU-only machines and CI skip cleanly. A test that
// cannot run its scenario here calls ReportSkipped; the binary then also exits 77 (when nothing
// failed), printing each reason, so nothing unrun is counted as passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <torch/cuda.h>

#include <cstdio>
#include <mutex>
#include <vector>

#include "tests/support/gpu_skip.h"

namespace rlhfd::testing {
namespace {

std::mutex& SkipMutex() {
  static std::mutex mutex;
  return mutex;
}
std::vector<std::string>& Skips() {
  static std::vector<std::string> skips;
  return skips;
}

}  // namespace

void ReportSkipped(const std::string& reason) {
  std::lock_guard<std::mutex> lock(SkipMutex());
  Skips().push_back(Catch::getResultCapture().getCurrentTestName() + ": " + reason);
}

}  // namespace rlhfd::testing

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::printf("SKIPPED: no CUDA device visible to LibTorch; [gpu] tests run on a GPU machine\n");
    return 77;
  }
  const int result = Catch::Session().run(argc, argv);
  const auto& skips = rlhfd::testing::Skips();
  if (result != 0 || skips.empty()) return result;
  for (const std::string& reason : skips) std::printf("SKIPPED: %s\n", reason.c_str());
  return 77;
}
