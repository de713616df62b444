// Catch2 main for [gpu] test binaries: without a usable CUDA device it exits 77, which CTest
// reports as "skipped" (SKIP_RETURN_CODE), so CPU-only machines and CI skip cleanly.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <torch/cuda.h>

#include <cstdio>

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::printf("SKIPPED: no CUDA device visible to LibTorch; [gpu] tests run on a GPU machine\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
