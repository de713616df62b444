// decode_attention_bench: the rollout's decode-attention kernel alone (the spans and their merge)
// at a preset model's head shape: B sequences whose lengths are drawn uniformly from
// [--context_min, --context_max] in a paged cache of --block_size positions per block, each
// sequence's blocks scattered over the cache (a shuffled block table, as a long run leaves them).
// Prints a JSON line and a table per batch size: µs per call (one layer), the bytes of keys and
// values it must read over that time, their share of the device-to-device copy bandwidth measured
// in the same run, and the largest difference from a float32 reference.
//   decode_attention_bench --preset=qwen2.5-7b --batch=256,64 --context_min=257 --context_max=512
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>
#include <torch/types.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/util/program_setup.h"
#include "worker/bench/gpu_bench_support.h"
#include "worker/bench/model_presets.h"
#include "worker/rollout/decode_attention.h"
#include "worker/rollout/device_support.h"
#include "worker/rollout/kernels.h"

ABSL_FLAG(std::string, preset, "qwen2.5-7b", "qwen2.5-0.5b, qwen2.5-1.5b or qwen2.5-7b");
ABSL_FLAG(std::vector<std::string>, batch, (std::vector<std::string>{"256", "64"}),
          "Sequences per call, comma-separated");
ABSL_FLAG(int64_t, context_min, 257, "Shortest sequence (keys attended)");
ABSL_FLAG(int64_t, context_max, 512, "Longest sequence; also the block table's capacity");
ABSL_FLAG(int64_t, block_size, 32, "Positions per KV cache block, a multiple of 32");
ABSL_FLAG(int64_t, iterations, 200, "Timed calls");

namespace {

using Clock = std::chrono::steady_clock;

void RunBatch(const rlhfd::model::ModelConfig& config, int64_t batch, double bandwidth,
              const at::Device& device) {
  const int64_t heads = config.num_heads, kv_heads = config.num_kv_heads, d = config.head_dim;
  const int64_t lo = absl::GetFlag(FLAGS_context_min), capacity = absl::GetFlag(FLAGS_context_max);
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16).device(device);
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device);
  const int64_t block_size = absl::GetFlag(FLAGS_block_size);
  const int64_t max_blocks = (capacity + block_size - 1) / block_size;
  const at::Tensor k_cache = at::randn({batch * max_blocks, kv_heads, block_size, d}, bf16);
  const at::Tensor v_cache = at::randn({batch * max_blocks, kv_heads, block_size, d}, bf16);
  const at::Tensor q = at::randn({batch, heads, 1, d}, bf16);
  const at::Tensor tables = at::randperm(batch * max_blocks, longs).view({batch, max_blocks});
  const at::Tensor positions = at::randint(lo - 1, capacity, {batch}, longs);
  at::Tensor out = at::empty({batch, heads, 1, d}, bf16);
  const at::Tensor workspace = at::empty({rlhfd::rollout::kernels::DecodeAttentionWorkspaceBytes(
                                             batch, heads, d, max_blocks * block_size)},
                                         bf16.dtype(at::kByte));
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index());
  const auto call = [&] {
    return rlhfd::rollout::kernels::DecodeAttention(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr<int64_t>(),
        positions.data_ptr<int64_t>(), out.data_ptr(), workspace.data_ptr(), batch, heads, kv_heads,
        d, max_blocks, block_size, scale, stream);
  };
  if (!call()) {
    std::cerr << "the kernel does not serve this shape\n";
    return;
  }
  const at::Tensor expected = rlhfd::rollout::DecodeAttentionReference(
      q.to(at::kFloat), k_cache.to(at::kFloat), v_cache.to(at::kFloat), tables, positions);
  const double max_diff = (out.to(at::kFloat) - expected).abs().max().item<double>();
  const int64_t iterations = absl::GetFlag(FLAGS_iterations);
  rlhfd::rollout::Synchronize(device);
  const auto start = Clock::now();
  for (int64_t i = 0; i < iterations; ++i) call();
  rlhfd::rollout::Synchronize(device);
  const double us = 1e6 * std::chrono::duration<double>(Clock::now() - start).count() / iterations;
  const double kv_bytes =
      (positions.sum().item<double>() + batch) * kv_heads * d * 2 /*k, v*/ * 2 /*bf16*/;
  const double read_rate = kv_bytes / (us * 1e-6);
  nlohmann::json line = {{"preset", absl::GetFlag(FLAGS_preset)},
                         {"batch", batch},
                         {"heads", heads},
                         {"kv_heads", kv_heads},
                         {"head_dim", d},
                         {"context_min", lo},
                         {"context_max", capacity},
                         {"block_size", block_size},
                         {"us_per_call", us},
                         {"kv_bytes", kv_bytes},
                         {"kv_read_gbps", read_rate / 1e9},
                         {"copy_bandwidth_gbps", bandwidth / 1e9},
                         {"share_of_copy_bandwidth", read_rate / bandwidth},
                         {"max_abs_diff_vs_fp32", max_diff}};
  std::cout << line.dump() << "\n";
  std::printf(
      "%-14s B=%-4ld H=%-3ld K=%-2ld D=%-4ld context %ld-%ld | %8.1f us | %6.0f GB/s of "
      "keys and values (%4.1f%% of copy bandwidth) | max |diff| %.4f\n",
      absl::GetFlag(FLAGS_preset).c_str(), batch, heads, kv_heads, d, lo, capacity, us,
      read_rate / 1e9, 100.0 * read_rate / bandwidth, max_diff);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  rlhfd::SetUpProgram();
  absl::ParseCommandLine(argc, argv);
  auto config = rlhfd::bench::PresetConfig(absl::GetFlag(FLAGS_preset));
  if (!config.ok()) {
    std::cerr << config.status().message() << "\n";
    return 2;
  }
  const int64_t lo = absl::GetFlag(FLAGS_context_min), hi = absl::GetFlag(FLAGS_context_max);
  if (lo < 1 || hi < lo) {
    std::cerr << "--context_min and --context_max: need 1 <= min <= max\n";
    return 2;
  }
  const int64_t block_size = absl::GetFlag(FLAGS_block_size);
  if (block_size < 32 || block_size % 32 != 0) {
    std::cerr << "--block_size: need a positive multiple of 32\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_iterations) < 1) {
    std::cerr << "--iterations: need at least 1\n";
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::cerr << "decode_attention_bench needs a CUDA GPU\n";
    return 1;
  }
  const std::optional<std::vector<int64_t>> batches =
      rlhfd::bench::BatchSizes(absl::GetFlag(FLAGS_batch));
  if (!batches) return 2;
  const at::Device device(at::kCUDA, 0);
  torch::NoGradGuard no_grad;
  at::manual_seed(0);
  const double bandwidth = rlhfd::bench::CopyBandwidth(device);
  for (int64_t b : *batches) RunBatch(*config, b, bandwidth, device);
  return 0;
}
