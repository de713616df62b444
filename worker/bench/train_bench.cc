// train_bench: tokens/s and MFU of one training step (forward, backward, AdamW) of a preset model
// shape in bf16 autocast over float32 master weights, on the GPU. Prints a JSON line and a table.
//   train_bench --preset=qwen2.5-0.5b --micro_batch=16 --seq_len=1024 --steps=10 --warmup=3
// FLOPs per token are counted as 6·N + 12·L·T·C (N parameters, L layers, T sequence length,
// C hidden size), the formula the transformers baseline uses; the peak is --peak_tflops.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
#include <torch/types.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/util/program_setup.h"
#include "worker/bench/model_presets.h"
#include "worker/model/transformer.h"
#include "worker/train/chunked_log_probs.h"
#include "worker/train/optimizer.h"

ABSL_FLAG(std::string, preset, "qwen2.5-0.5b", "qwen2.5-0.5b, qwen2.5-1.5b or qwen2.5-7b");
ABSL_FLAG(int, micro_batch, 16, "Sequences per step");
ABSL_FLAG(int, seq_len, 1024, "Tokens per sequence");
ABSL_FLAG(int, steps, 10, "Timed steps");
ABSL_FLAG(int, warmup, 3, "Untimed steps first");
ABSL_FLAG(double, peak_tflops, 791.0, "bf16 dense peak used for MFU (measured on the H200)");
ABSL_FLAG(std::string, profile, "", "Write a Chrome trace of two more steps to this file");
ABSL_FLAG(std::string, loss, "chunked",
          "chunked: next-token log-probs and entropy through ChunkedLogProbs, as the actor update "
          "computes them (no (B, T, V) logits tensor); full: logits, then at::cross_entropy_loss "
          "(as the transformers baseline, tests/bench/hf_train_baseline.py, computes its loss; "
          "the default until 2026-12-06)");
ABSL_FLAG(bool, activation_checkpointing, false,
          "Recompute each decoder layer in backward (less activation memory, more compute)");
ABSL_FLAG(bool, breakdown, false,
          "Also time forward+loss, backward and optimizer separately (synchronising between them)");

int main(int argc, char** argv) {
  rlhfd::SetUpProgram();
  absl::ParseCommandLine(argc, argv);
  if (!torch::cuda::is_available()) {
    std::cerr << "train_bench needs a CUDA GPU\n";
    return 1;
  }
  auto config = rlhfd::bench::PresetConfig(absl::GetFlag(FLAGS_preset));
  if (!config.ok()) {
    std::cerr << config.status().message() << "\n";
    return 2;
  }
  const int64_t b = absl::GetFlag(FLAGS_micro_batch), t = absl::GetFlag(FLAGS_seq_len);
  const std::string loss_kind = absl::GetFlag(FLAGS_loss);
  if (loss_kind != "chunked" && loss_kind != "full") {
    std::cerr << "--loss must be chunked or full\n";
    return 2;
  }
  const bool chunked_loss = loss_kind == "chunked";
  at::manual_seed(0);
  rlhfd::model::Transformer model(*config);
  for (auto& p : model->parameters()) {
    at::NoGradGuard no_grad;
    p.normal_(0, 0.02);
  }
  model->to(at::Device(at::kCUDA, 0), at::kFloat);  // float32 masters
  model->train();
  model->set_activation_checkpointing(absl::GetFlag(FLAGS_activation_checkpointing));
  rlhfd::train::AdamW optimizer(model->parameters(), {});
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();

  const auto options = at::TensorOptions().dtype(at::kLong).device(at::kCUDA);
  // Seconds spent in forward+loss, backward, optimizer (only with --breakdown).
  double phase[3] = {0, 0, 0};
  bool timing_phases = false;
  auto mark = [&](int index, std::chrono::steady_clock::time_point& since) {
    if (!timing_phases) return;
    c10::cuda::device_synchronize();
    const auto now = std::chrono::steady_clock::now();
    phase[index] += std::chrono::duration<double>(now - since).count();
    since = now;
  };
  auto step = [&] {
    auto since = std::chrono::steady_clock::now();
    at::Tensor ids = at::randint(0, config->vocab_size, {b, t + 1}, options);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::Tensor hidden = model->Hidden({ids.narrow(1, 0, t)});
    const at::Tensor targets = ids.narrow(1, 1, t).reshape({b * t});
    at::Tensor loss;
    if (chunked_loss) {
      loss = -rlhfd::train::ChunkedLogProbs(hidden.reshape({b * t, -1}), model->HeadWeight(),
                                            targets)
                  .first.mean();
    } else {
      at::Tensor logits = model->Logits(hidden);  // (B, T, V)
      loss = at::cross_entropy_loss(logits.view({b * t, -1}), targets);
    }
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
    mark(0, since);
    loss.backward();
    mark(1, since);
    optimizer.ClipGradNorm(1.0);
    optimizer.Step(1e-5);
    optimizer.ZeroGrad();
    mark(2, since);
    return loss;
  };
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i) step();
  c10::cuda::device_synchronize();
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  const auto start = std::chrono::steady_clock::now();
  at::Tensor loss;
  for (int i = 0; i < absl::GetFlag(FLAGS_steps); ++i) loss = step();
  c10::cuda::device_synchronize();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double tokens = static_cast<double>(b * t) * absl::GetFlag(FLAGS_steps);
  const double flops_per_token =
      6.0 * params + 12.0 * config->num_layers * t * config->hidden_size;
  const double tflops = tokens / seconds * flops_per_token / 1e12;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  const double peak_gib = static_cast<double>(stats.allocated_bytes[0].peak) / (1 << 30);
  nlohmann::json result = {
      {"bench", "train_step"}, {"preset", absl::GetFlag(FLAGS_preset)}, {"micro_batch", b},
      {"seq_len", t}, {"steps", absl::GetFlag(FLAGS_steps)}, {"params", params},
      {"tokens_per_s", tokens / seconds}, {"ms_per_step", seconds * 1e3 / absl::GetFlag(FLAGS_steps)},
      {"tflops", tflops}, {"mfu", tflops / absl::GetFlag(FLAGS_peak_tflops)},
      {"peak_memory_gib", peak_gib},
      {"activation_checkpointing", absl::GetFlag(FLAGS_activation_checkpointing)},
      {"loss", loss_kind},
      {"final_loss", loss.item<double>()}};
  std::cout << result.dump() << "\n";
  std::printf("%-14s %8s %12s %10s %8s %6s %9s\n", "preset", "tokens", "tokens/s", "ms/step",
              "TFLOP/s", "MFU", "peak GiB");
  std::printf("%-14s %8ld %12.0f %10.1f %8.1f %5.1f%% %9.1f\n", absl::GetFlag(FLAGS_preset).c_str(),
              static_cast<long>(b * t), tokens / seconds, seconds * 1e3 / absl::GetFlag(FLAGS_steps),
              tflops, 100 * tflops / absl::GetFlag(FLAGS_peak_tflops), peak_gib);
  if (const std::string path = absl::GetFlag(FLAGS_profile); !path.empty()) {
    namespace profiler = torch::autograd::profiler;
    const profiler::ProfilerConfig config(profiler::ProfilerState::KINETO);
    const std::set<torch::profiler::impl::ActivityType> activities = {
        torch::profiler::impl::ActivityType::CPU, torch::profiler::impl::ActivityType::CUDA};
    profiler::prepareProfiler(config, activities);
    profiler::enableProfiler(config, activities);
    for (int i = 0; i < 2; ++i) step();
    c10::cuda::device_synchronize();
    profiler::disableProfiler()->save(path);
  }
  if (absl::GetFlag(FLAGS_breakdown)) {
    timing_phases = true;
    for (int i = 0; i < absl::GetFlag(FLAGS_steps); ++i) step();
    const double n = absl::GetFlag(FLAGS_steps);
    nlohmann::json breakdown = {{"bench", "train_step_breakdown"},
                                {"forward_and_loss_ms", phase[0] * 1e3 / n},
                                {"backward_ms", phase[1] * 1e3 / n},
                                {"clip_and_optimizer_ms", phase[2] * 1e3 / n}};
    std::cout << breakdown.dump() << "\n";
  }
  return 0;
}
