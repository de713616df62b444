// [gpu] smoke test: the build's CUDA, LibTorch and NCCL work together on this machine. Skipped
// (exit 77, by gpu_test_main) where no GPU is visible.
#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <torch/cuda.h>

#include <catch2/catch.hpp>
#include <iostream>

TEST_CASE("CUDA devices are visible", "[gpu]") {
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  REQUIRE(count >= 1);
  CHECK(static_cast<int>(torch::cuda::device_count()) == count);
  cudaDeviceProp properties{};
  REQUIRE(cudaGetDeviceProperties(&properties, 0) == cudaSuccess);
  std::cout << "gpu_smoke: " << count << " device(s); device 0: " << properties.name << ", "
            << properties.totalGlobalMem / (1 << 20) << " MiB, sm_" << properties.major
            << properties.minor << "\n";
}

TEST_CASE("a CUDA tensor op through LibTorch matches the CPU", "[gpu]") {
  at::manual_seed(0);
  const at::Tensor a = at::randn({512, 256});
  const at::Tensor b = at::randn({256, 128});
  const at::Tensor expected = at::matmul(a, b);
  const at::Tensor on_gpu = at::matmul(a.cuda(), b.cuda());
  REQUIRE(on_gpu.is_cuda());
  const double max_diff = (on_gpu.cpu() - expected).abs().max().item<double>();
  std::cout << "gpu_smoke: fp32 matmul max |gpu - cpu| = " << max_diff << "\n";
  // TF32 may be used for fp32 matmul on Hopper; 1e-2 bounds that on these magnitudes.
  CHECK(max_diff < 1e-2);
  const at::Tensor bf16 = at::matmul(a.cuda().to(at::kBFloat16), b.cuda().to(at::kBFloat16));
  const double rel =
      ((bf16.to(at::kFloat).cpu() - expected).norm() / expected.norm()).item<double>();
  std::cout << "gpu_smoke: bf16 matmul relative error = " << rel << "\n";
  CHECK(rel < 1e-2);
}

TEST_CASE("NCCL reports its version and runs an all-reduce on one rank", "[gpu]") {
  int version = 0;
  REQUIRE(ncclGetVersion(&version) == ncclSuccess);
  std::cout << "gpu_smoke: NCCL version code " << version << " (" << version / 10000 << "."
            << (version / 100) % 100 << "." << version % 100 << ")\n";
  CHECK(version >= 22800);
  ncclComm_t comm = nullptr;
  int device = 0;
  REQUIRE(ncclCommInitAll(&comm, 1, &device) == ncclSuccess);
  at::Tensor values = at::arange(1024, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
  REQUIRE(ncclAllReduce(values.data_ptr(), values.data_ptr(), values.numel(), ncclFloat, ncclSum,
                        comm, /*stream=*/nullptr) == ncclSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(values.sum().item<double>() == Approx(1023.0 * 1024 / 2));
  ncclCommDestroy(comm);
}
