// What the GPU benchmarks (rollout_bench, decode_attention_bench) share: the device's measured
// copy bandwidth, their roofline's denominator, and the parsing of a list of batch sizes.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "worker/rollout/device_support.h"

namespace rlhfd::bench {

// Device-to-device copy bandwidth (bytes read + written per second) of a 1 GiB buffer.
inline double CopyBandwidth(const at::Device& device) {
  using Clock = std::chrono::steady_clock;
  const int64_t bytes = int64_t{1} << 30;
  at::Tensor src = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).device(device));
  at::Tensor dst = at::empty_like(src);
  dst.copy_(src);
  rollout::Synchronize(device);
  const int reps = 20;
  const auto start = Clock::now();
  for (int i = 0; i < reps; ++i) dst.copy_(src);
  rollout::Synchronize(device);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return 2.0 * bytes * reps / seconds;
}

// The --batch flag's words as positive counts; nullopt (after saying which word) otherwise.
inline std::optional<std::vector<int64_t>> BatchSizes(const std::vector<std::string>& words) {
  std::vector<int64_t> sizes;
  for (const std::string& word : words) {
    int64_t b = 0;
    if (!absl::SimpleAtoi(word, &b) || b < 1) {
      std::cerr << "--batch: '" << word << "' is not a positive count\n";
      return std::nullopt;
    }
    sizes.push_back(b);
  }
  return sizes;
}

}  // namespace rlhfd::bench
