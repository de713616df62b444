// stage_bench: GRPO steps of one worker hosting the actor and the reference (colocated), through
// the stage service as the driver calls it: each stage's time, the step time, peak memory, and
// memory after offload and after release. Random weights of a preset shape, prompts of exactly
// --prompt_len tokens (cut from longer text), responses of up to --response_len tokens.
//   stage_bench --preset=qwen2.5-0.5b --prompts=64 --n=8 --prompt_len=256 --response_len=256
//               --tokenizer=tests/fixtures/models/tiny-qwen2 --steps=3 --warmup=1
// Prints one JSON line and a table.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/cuda.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"
#include "common/util/program_setup.h"
#include "common/util/stopwatch.h"
#include "controller/driver/job_stages.h"
#include "worker/bench/model_presets.h"
#include "worker/model/safetensors_writer.h"
#include "worker/model/transformer.h"
#include "worker/roles/role_host.h"

ABSL_FLAG(std::string, preset, "qwen2.5-0.5b", "qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-7b or tiny");
ABSL_FLAG(std::string, tokenizer, "tests/fixtures/models/tiny-qwen2",
          "Directory with tokenizer.json (its ids must fit the preset's vocabulary)");
ABSL_FLAG(std::string, device, "cuda", "cuda or cpu");
ABSL_FLAG(int, prompts, 64, "Prompts per step");
ABSL_FLAG(int, n, 8, "Responses per prompt");
ABSL_FLAG(int, prompt_len, 256, "Tokens per prompt");
ABSL_FLAG(int, response_len, 256, "Tokens per response at most");
ABSL_FLAG(int, mini_batch, 64, "ppo_mini_batch_size (prompts per optimiser step)");
ABSL_FLAG(int, micro_batch, 16, "ppo_micro_batch_size_per_gpu and the log-prob micro-batch");
ABSL_FLAG(double, kl_coef, 0.001, "KL loss coefficient (low_var_kl)");
ABSL_FLAG(int, steps, 3, "Timed steps");
ABSL_FLAG(int, warmup, 1, "Untimed steps first");
ABSL_FLAG(std::string, work_dir, "/tmp/rlhfd-stage-bench", "Where the random model is written");

namespace rlhfd {
namespace {

absl::StatusOr<model::ModelConfig> Config(const std::string& preset) {
  if (preset != "tiny") return bench::PresetConfig(preset);
  model::ModelConfig c;
  c.architecture = "Qwen2ForCausalLM";
  c.family = model::ModelFamily::kQwen2;
  c.attention_bias = true;
  c.vocab_size = 512, c.hidden_size = 64, c.intermediate_size = 160, c.num_layers = 2;
  c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 16, c.tie_word_embeddings = true;
  c.max_position_embeddings = 4096;
  return c;
}

// A Hugging Face directory with random weights of `config` and the tokenizer's files.
absl::Status WriteModel(const model::ModelConfig& config, const std::string& tokenizer,
                        const std::string& dir) {
  RETURN_IF_ERROR(MakeDirectories(dir));
  const nlohmann::json json = {{"architectures", {"Qwen2ForCausalLM"}},
                               {"model_type", "qwen2"},
                               {"vocab_size", config.vocab_size},
                               {"hidden_size", config.hidden_size},
                               {"intermediate_size", config.intermediate_size},
                               {"num_hidden_layers", config.num_layers},
                               {"num_attention_heads", config.num_heads},
                               {"num_key_value_heads", config.num_kv_heads},
                               {"max_position_embeddings", config.max_position_embeddings},
                               {"rms_norm_eps", 1e-6},
                               {"rope_theta", config.rope.theta},
                               {"tie_word_embeddings", config.tie_word_embeddings},
                               {"hidden_act", "silu"},
                               {"eos_token_id", config.vocab_size - 1},
                               {"torch_dtype", "bfloat16"}};
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/config.json", json.dump(1)));
  at::manual_seed(0);
  model::Transformer module(config);
  std::vector<std::pair<std::string, at::Tensor>> weights;
  {
    at::NoGradGuard no_grad;
    for (auto& item : module->named_parameters()) {
      at::Tensor& p = item.value();
      if (item.key().find("norm") != std::string::npos) {
        p.fill_(1.0);
      } else {
        p.normal_(0, 0.02);
      }
      weights.emplace_back(item.key(), p.to(at::kBFloat16));
    }
  }
  RETURN_IF_ERROR(model::WriteSafetensors(dir + "/model.safetensors", weights));
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
    const std::string from = absl::StrCat(tokenizer, "/", file);
    if (!PathExists(from)) continue;
    std::filesystem::copy_file(from, absl::StrCat(dir, "/", file),
                               std::filesystem::copy_options::overwrite_existing);
  }
  return absl::OkStatus();
}

double GiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); }

struct Memory {
  int64_t allocated = 0, peak = 0, reserved = 0;
};

Memory DeviceMemory(bool cuda) {
  if (!cuda) return {};
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  using Stat = c10::CachingAllocator::StatType;
  const auto all = static_cast<size_t>(Stat::AGGREGATE);
  return {stats.allocated_bytes[all].current, stats.allocated_bytes[all].peak,
          stats.reserved_bytes[all].current};
}

int Run() {
  const bool cuda = absl::GetFlag(FLAGS_device) == "cuda";
  if (cuda && !torch::cuda::is_available()) {
    std::cerr << "stage_bench: --device=cuda needs a GPU\n";
    return 1;
  }
  auto config = Config(absl::GetFlag(FLAGS_preset));
  if (!config.ok()) {
    std::cerr << config.status().message() << "\n";
    return 2;
  }
  const std::string model_dir = absl::GetFlag(FLAGS_work_dir) + "/" + absl::GetFlag(FLAGS_preset);
  if (absl::Status written = WriteModel(*config, absl::GetFlag(FLAGS_tokenizer), model_dir);
      !written.ok()) {
    std::cerr << written.message() << "\n";
    return 1;
  }
  const int prompts = absl::GetFlag(FLAGS_prompts), n = absl::GetFlag(FLAGS_n);
  const int steps = absl::GetFlag(FLAGS_steps), warmup = absl::GetFlag(FLAGS_warmup);
  const std::string yaml =
      absl::StrCat(R"(
name: stage-bench
model: {path: )",
                   model_dir, R"(, dtype: )", cuda ? "bf16" : "fp32", R"(}
data: {train_files: [unused.jsonl], max_prompt_length: )",
                   absl::GetFlag(FLAGS_prompt_len), R"(, truncation: left, max_response_length: )",
                   absl::GetFlag(FLAGS_response_len), R"(, train_batch_size: )", prompts, R"(}
algorithm: {adv_estimator: grpo, kl: {mode: loss, coef: )",
                   absl::GetFlag(FLAGS_kl_coef),
                   R"(, estimator: k3}}
roles:
  actor:
    gpus: 1
    train: {ppo_mini_batch_size: )",
                   absl::GetFlag(FLAGS_mini_batch), R"(, ppo_micro_batch_size_per_gpu: )",
                   absl::GetFlag(FLAGS_micro_batch), R"(, lr: 1.0e-6}
    rollout: {n: )",
                   n, R"(, temperature: 1.0, max_num_seqs: 1024, gpu_memory_utilization: 0.5,
              log_prob_micro_batch_size_per_gpu: )",
                   absl::GetFlag(FLAGS_micro_batch), R"(}
  reference: {log_prob_micro_batch_size_per_gpu: )",
                   absl::GetFlag(FLAGS_micro_batch), R"(}
  reward: {rule: exact_match}
placement: colocated
trainer: {total_steps: )",
                   warmup + steps, R"(}
)");
  auto spec = config::ParseJobSpec(yaml, "stage_bench");
  if (!spec.ok()) {
    std::cerr << spec.status().message() << "\n";
    return 1;
  }
  roles::RoleHost host({.device = cuda ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU)});
  controller::JobStages job("bench", *spec, {&host});
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status started = job.Start(warmup + steps); !started.ok()) {
    std::cerr << started.message() << "\n";
    return 1;
  }
  const double load_s = SecondsSince(start);
  // Prompts longer than prompt_len tokens (cut on the left to exactly prompt_len).
  std::vector<v1::PromptRow> rows;
  for (int i = 0; i < prompts; ++i) {
    v1::PromptRow row;
    std::string text;
    for (int word = 0; text.size() < 8u * absl::GetFlag(FLAGS_prompt_len); ++word) {
      absl::StrAppend(&text, "item ", i, " word ", word, " of the bench; ");
    }
    row.set_text(text);
    row.set_ground_truth_json("\"no\"");
    rows.push_back(row);
  }
  std::map<std::string, double> sums;
  double peak = 0;
  for (int step = 1; step <= warmup + steps; ++step) {
    if (cuda) c10::cuda::CUDACachingAllocator::resetPeakStats(0);
    auto metrics =
        job.RunStep({.step = step, .prompts = rows, .seed = static_cast<uint64_t>(step)});
    if (!metrics.ok()) {
      std::cerr << "step " << step << ": " << metrics.status().message() << "\n";
      return 1;
    }
    peak = std::max(peak, GiB(DeviceMemory(cuda).peak));
    std::fprintf(stderr, "step %d: %.2f s (gen %.2f)\n", step, metrics->at("timing_s/step"),
                 metrics->at("timing_s/gen"));
    if (step <= warmup) continue;
    for (const auto& [name, value] : *metrics) sums[name] += value / steps;
  }
  const Memory trained = DeviceMemory(cuda);
  v1::OffloadRequest offload;
  offload.mutable_key()->set_job_id("bench");
  offload.mutable_key()->set_step(warmup + steps);
  offload.mutable_key()->set_stage("offload");
  offload.mutable_key()->set_attempt(1);  // JobStages' default
  offload.add_roles(v1::ROLE_ACTOR);
  offload.add_roles(v1::ROLE_REFERENCE);
  offload.set_to_host(true);
  auto offloaded =
      stages::CallStage(host, &stages::StageService::Offload, offload, absl::Minutes(5));
  if (cuda) c10::cuda::CUDACachingAllocator::emptyCache();
  const Memory after_offload = DeviceMemory(cuda);
  offload.mutable_key()->set_stage("onload");
  offload.set_to_host(false);
  auto onloaded =
      stages::CallStage(host, &stages::StageService::Offload, offload, absl::Minutes(5));
  job.End();
  if (cuda) c10::cuda::CUDACachingAllocator::emptyCache();
  const Memory released = DeviceMemory(cuda);

  nlohmann::json out = {{"preset", absl::GetFlag(FLAGS_preset)},
                        {"device", absl::GetFlag(FLAGS_device)},
                        {"prompts", prompts},
                        {"n", n},
                        {"prompt_len", absl::GetFlag(FLAGS_prompt_len)},
                        {"response_len", absl::GetFlag(FLAGS_response_len)},
                        {"mini_batch", absl::GetFlag(FLAGS_mini_batch)},
                        {"micro_batch", absl::GetFlag(FLAGS_micro_batch)},
                        {"steps", steps},
                        {"load_s", load_s},
                        {"peak_memory_gib", peak},
                        {"memory_after_steps_gib", GiB(trained.allocated)},
                        {"memory_after_offload_gib", GiB(after_offload.allocated)},
                        {"offload_ok", offloaded.ok() && onloaded.ok()},
                        {"memory_after_release_gib", GiB(released.allocated)}};
  for (const auto& [name, value] : sums) out["mean"][name] = value;
  std::cout << out.dump() << "\n";
  std::printf("\n%-28s %10s\n", "stage (mean of timed steps)", "seconds");
  for (const char* name :
       {"timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/reward", "timing_s/adv",
        "timing_s/update_actor", "timing_s/step"}) {
    std::printf("%-28s %10.3f\n", name, sums.count(name) ? sums[name] : 0.0);
  }
  std::printf("%-28s %10.1f\n", "response_length/mean", sums["response_length/mean"]);
  std::printf(
      "peak %.2f GiB; after the steps %.2f GiB; after offload %.2f GiB; after release "
      "%.2f GiB\n",
      peak, GiB(trained.allocated), GiB(after_offload.allocated), GiB(released.allocated));
  return 0;
}

}  // namespace
}  // namespace rlhfd

int main(int argc, char** argv) {
  rlhfd::SetUpProgram();
  absl::ParseCommandLine(argc, argv);
  return rlhfd::Run();
}
