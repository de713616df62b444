// rollout_bench: generation throughput of the rollout engine for a preset model shape with random
// weights in bf16 on the GPU. B prompts of P random tokens, every response run to N new tokens.
// Prints a JSON line and a table: tokens/s, ms per decode step, prefill time, and the share of
// the memory-bandwidth roofline (bytes a decode step must read over the device-to-device copy
// bandwidth measured in the same run).
//   rollout_bench --preset=qwen2.5-0.5b --batch=256,64 --prompt_len=256 --new_tokens=256
#include <ATen/ATen.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
#include <torch/types.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/util/program_setup.h"
#include "worker/bench/gpu_bench_support.h"
#include "worker/bench/model_presets.h"
#include "worker/rollout/device_support.h"
#include "worker/rollout/engine.h"

ABSL_FLAG(std::string, preset, "qwen2.5-0.5b", "qwen2.5-0.5b, qwen2.5-1.5b or qwen2.5-7b");
ABSL_FLAG(std::vector<std::string>, batch, {"256"},
          "Prompts (B); a comma-separated list runs each");
ABSL_FLAG(int64_t, prompt_len, 256, "Tokens per prompt (P)");
ABSL_FLAG(int64_t, new_tokens, 256, "New tokens per response (N); EOS is ignored");
ABSL_FLAG(double, temperature, 1.0, "0 = greedy");
ABSL_FLAG(bool, cuda_graphs, true, "Replay decode steps as CUDA graphs");
ABSL_FLAG(double, gpu_memory_utilization, 0.6, "Share of free GPU memory for the KV cache");
ABSL_FLAG(int64_t, kv_block_size, 32, "Positions per KV cache block, a multiple of 32");
ABSL_FLAG(int64_t, max_prefill_tokens, 16384,
          "Prompt tokens per prefill forward (the engine's default); B x P in one forward makes "
          "a --profile's decode steps follow all of the prefill rather than interleave with it");
ABSL_FLAG(int64_t, repeat, 2, "Timed runs; the best is reported");
ABSL_FLAG(std::string, write_hf_config, "",
          "Write the preset's Hugging Face config.json into this directory and exit (the same "
          "shape for a peer: tests/bench/vllm_generate_baseline.py)");
ABSL_FLAG(std::string, profile, "",
          "Also write Chrome traces of one more run per batch with 32 new tokens to PREFIX.bB.json "
          "(summarise with tests/bench/summarize_trace.py FILE 32; the decode steps alone, with "
          "--max_prefill_tokens=B*P: FILE 31 25 DecodeAttention)");

namespace {

using Clock = std::chrono::steady_clock;

// One batch size: a fresh engine, a warm-up (cache and graphs), then the best of --repeat runs.
// Returns false (after printing why) when it cannot run.
bool RunBatch(rlhfd::model::Transformer& model, const rlhfd::model::ModelConfig& config,
              int64_t weight_bytes, double bandwidth, int64_t b) {
  const int64_t p = absl::GetFlag(FLAGS_prompt_len), n = absl::GetFlag(FLAGS_new_tokens);
  rlhfd::rollout::EngineOptions options;
  options.max_num_seqs = b;
  options.max_model_len = p + n;
  options.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  options.gpu_memory_utilization = absl::GetFlag(FLAGS_gpu_memory_utilization);
  options.kv_block_size = absl::GetFlag(FLAGS_kv_block_size);
  options.max_prefill_tokens = absl::GetFlag(FLAGS_max_prefill_tokens);
  auto engine = rlhfd::rollout::GenerationEngine::Create(model, options);
  if (!engine.ok()) {
    std::cerr << engine.status().message() << "\n";
    return false;
  }
  std::vector<rlhfd::rollout::GenerationRequest> requests(b);
  at::Tensor prompts = at::randint(0, config.vocab_size, {b, p}, at::kLong);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t* row = prompts[i].data_ptr<int64_t>();
    requests[i].prompt_ids.assign(row, row + p);
    requests[i].sampling.temperature = absl::GetFlag(FLAGS_temperature);
    requests[i].sampling.seed = i;
    requests[i].sampling.max_new_tokens = n;
    requests[i].sampling.ignore_eos = true;
  }
  auto warmup = requests;
  for (auto& request : warmup) request.sampling.max_new_tokens = 4;
  if (auto status = (*engine)->Generate(warmup); !status.ok()) {
    std::cerr << status.status().message() << "\n";
    return false;
  }
  // Every sequence at full length in the cache, so the figure is of B sequences decoded together
  // (no preemption).
  const int64_t block_size = (*engine)->options().kv_block_size;
  const int64_t needed = b * ((p + n + block_size - 1) / block_size);
  if ((*engine)->stats().cache_blocks < needed) {
    std::cerr << "the KV cache holds " << (*engine)->stats().cache_blocks << " blocks of "
              << block_size << " positions, not the " << needed << " that " << b
              << " sequences of P + N take; raise --gpu_memory_utilization\n";
    return false;
  }
  double best_seconds = 1e30, prefill_seconds = 0, decode_seconds = 0;
  int64_t decode_steps = 0;
  for (int64_t r = 0; r < absl::GetFlag(FLAGS_repeat); ++r) {
    const rlhfd::rollout::EngineStats before = (*engine)->stats();
    const auto start = Clock::now();
    auto results = (*engine)->Generate(requests);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (!results.ok()) {
      std::cerr << results.status().message() << "\n";
      return false;
    }
    const rlhfd::rollout::EngineStats& after = (*engine)->stats();
    if (seconds < best_seconds) {
      best_seconds = seconds;
      prefill_seconds = after.prefill_seconds - before.prefill_seconds;
      decode_seconds = after.decode_seconds - before.decode_seconds;
      decode_steps = after.decode_steps - before.decode_steps;
    }
  }
  if (const std::string path = absl::GetFlag(FLAGS_profile); !path.empty()) {
    namespace profiler = torch::autograd::profiler;
    const profiler::ProfilerConfig profile_config(profiler::ProfilerState::KINETO);
    const std::set<torch::profiler::impl::ActivityType> activities = {
        torch::profiler::impl::ActivityType::CPU, torch::profiler::impl::ActivityType::CUDA};
    auto short_run = requests;
    for (auto& request : short_run) request.sampling.max_new_tokens = 32;
    profiler::prepareProfiler(profile_config, activities);
    profiler::enableProfiler(profile_config, activities);
    if (auto status = (*engine)->Generate(short_run); !status.ok()) {
      std::cerr << status.status().message() << "\n";
      return false;
    }
    profiler::disableProfiler()->save(absl::StrCat(path, ".b", b, ".json"));
  }
  // A decode step reads every weight once (the tied embedding as the LM head) and each
  // sequence's cached keys and values; positions grow from P + 1 to P + N - 1 over the steps.
  const double kv_bytes_per_position =
      2.0 * config.num_layers * config.num_kv_heads * config.head_dim * 2;
  const double step_bytes = weight_bytes + b * (p + n / 2.0) * kv_bytes_per_position;
  const double roofline_step = step_bytes / bandwidth;
  const double tokens_per_second = b * n / best_seconds;
  const double step_ms = 1e3 * decode_seconds / std::max<int64_t>(decode_steps, 1);
  const double roofline_tokens_per_second = b / roofline_step;
  nlohmann::json out = {{"preset", absl::GetFlag(FLAGS_preset)},
                        {"batch", b},
                        {"prompt_len", p},
                        {"new_tokens", n},
                        {"cuda_graphs", options.cuda_graphs},
                        {"temperature", absl::GetFlag(FLAGS_temperature)},
                        {"tokens_per_second", tokens_per_second},
                        {"seconds", best_seconds},
                        {"prefill_seconds", prefill_seconds},
                        {"decode_ms_per_step", step_ms},
                        {"decode_steps", decode_steps},
                        {"copy_bandwidth_gbps", bandwidth / 1e9},
                        {"bytes_per_step", step_bytes},
                        {"roofline_ms_per_step", 1e3 * roofline_step},
                        {"roofline_tokens_per_second", roofline_tokens_per_second},
                        {"roofline_share_decode", 1e3 * roofline_step / step_ms},
                        {"roofline_share_overall", tokens_per_second / roofline_tokens_per_second},
                        {"peak_memory_gib", (*engine)->stats().peak_memory_bytes / double(1 << 30)},
                        {"kv_block_size", block_size},
                        {"cache_blocks", (*engine)->stats().cache_blocks},
                        {"preemptions", (*engine)->stats().preemptions}};
  std::cout << out.dump() << "\n";
  std::printf(
      "%-14s B=%-4ld P=%-4ld N=%-4ld | %9.0f tok/s | prefill %7.1f ms | decode %6.2f ms/step"
      " | roofline %5.2f ms/step (%4.1f%% of it in decode, %4.1f%% overall) | %.0f GB/s\n",
      absl::GetFlag(FLAGS_preset).c_str(), b, p, n, tokens_per_second, 1e3 * prefill_seconds,
      step_ms, 1e3 * roofline_step, 100.0 * 1e3 * roofline_step / step_ms,
      100.0 * tokens_per_second / roofline_tokens_per_second, bandwidth / 1e9);
  std::fflush(stdout);
  return true;
}

}  // namespace

// The preset as Hugging Face's Qwen2 config.json (bf16, random weights are the reader's).
nlohmann::json HfConfig(const rlhfd::model::ModelConfig& c) {
  return {{"architectures", {c.architecture}},
          {"model_type", "qwen2"},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_hidden_layers", c.num_layers},
          {"num_attention_heads", c.num_heads},
          {"num_key_value_heads", c.num_kv_heads},
          {"vocab_size", c.vocab_size},
          {"max_position_embeddings", c.max_position_embeddings},
          {"rope_theta", c.rope.theta},
          {"rms_norm_eps", c.rms_norm_eps},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"hidden_act", "silu"},
          {"torch_dtype", "bfloat16"},
          {"bos_token_id", nullptr},
          {"eos_token_id", nullptr}};
}

int main(int argc, char** argv) {
  rlhfd::SetUpProgram();
  absl::ParseCommandLine(argc, argv);
  auto config = rlhfd::bench::PresetConfig(absl::GetFlag(FLAGS_preset));
  if (!config.ok()) {
    std::cerr << config.status().message() << "\n";
    return 2;
  }
  if (const std::string dir = absl::GetFlag(FLAGS_write_hf_config); !dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(dir, error);
    std::ofstream out(dir + "/config.json");
    out << HfConfig(*config).dump(2) << "\n";
    out.close();
    if (error || !out) {
      std::cerr << "--write_hf_config: cannot write " << dir << "/config.json\n";
      return 1;
    }
    std::cout << dir << "/config.json\n";
    return 0;
  }
  if (!torch::cuda::is_available()) {
    std::cerr << "rollout_bench needs a CUDA GPU\n";
    return 1;
  }
  const std::optional<std::vector<int64_t>> batches =
      rlhfd::bench::BatchSizes(absl::GetFlag(FLAGS_batch));
  if (!batches) return 2;
  const at::Device device(at::kCUDA, 0);
  torch::NoGradGuard no_grad;
  at::manual_seed(0);
  rlhfd::model::Transformer model(*config);
  model->to(device, at::kBFloat16);  // Random values drawn on the GPU: faster for 7B.
  for (auto& parameter : model->parameters()) parameter.normal_(0, 0.02);
  int64_t weight_bytes = 0;
  for (const auto& parameter : model->parameters()) weight_bytes += parameter.nbytes();
  const double bandwidth = rlhfd::bench::CopyBandwidth(device);
  for (int64_t b : *batches) {
    if (!RunBatch(model, *config, weight_bytes, bandwidth, b)) return 1;
  }
  return 0;
}
