// rlhfd-infer: check a Hugging Face model directory by hand. Prints JSON.
//   rlhfd-infer tokenize --model DIR --text "..." [--chat] [--add_special_tokens]
//   rlhfd-infer logprobs --model DIR --text "..." [--prompt "..."] [--dtype fp32|bf16]
//                        [--device cpu|cuda]
//   rlhfd-infer generate --model DIR --prompts FILE.jsonl [--temperature --top_k --top_p --seed
//                        --max_new_tokens --n --stop_token_ids --ignore_eos] [--dtype --device]
//   rlhfd-infer export --model DIR --out DIR [--dtype fp32|bf16]
// Exit codes: 0 success, 1 the model or input is unusable (the message says why), 2 usage.
#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <torch/types.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/util/program_help.h"
#include "common/util/program_setup.h"
#include "worker/model/model_export.h"
#include "worker/model/model_loader.h"
#include "worker/model/tokenizer.h"
#include "worker/rollout/engine.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(std::string, text, "", "Text to tokenize or score");
ABSL_FLAG(std::string, prompt, "",
          "logprobs: text before --text that is conditioned on but not scored");
ABSL_FLAG(bool, chat, false, "tokenize: wrap --text as one user turn in the chat template");
ABSL_FLAG(bool, add_special_tokens, false, "tokenize: add the post-processor's special tokens");
ABSL_FLAG(std::string, dtype, "fp32", "logprobs, generate: fp32 or bf16");
ABSL_FLAG(std::string, device, "cpu", "logprobs, generate: cpu or cuda");
ABSL_FLAG(std::string, prompts, "",
          "generate: JSON lines, each {\"prompt\": text}, {\"messages\": [{role, content}...]} "
          "(chat template applied) or {\"prompt_ids\": [ids]}");
ABSL_FLAG(double, temperature, 1.0, "generate: 0 = greedy");
ABSL_FLAG(int64_t, top_k, 0, "generate: 0 = off");
ABSL_FLAG(double, top_p, 1.0, "generate: 1 = off");
ABSL_FLAG(int64_t, seed, -1,
          "generate: seed of the first prompt (prompt i gets seed + i); -1 = random");
ABSL_FLAG(int64_t, max_new_tokens, 64, "generate: tokens per response at most");
ABSL_FLAG(int64_t, n, 1, "generate: samples per prompt");
ABSL_FLAG(std::vector<std::string>, stop_token_ids, {}, "generate: comma-separated token ids");
ABSL_FLAG(bool, ignore_eos, false, "generate: run every response to --max_new_tokens");
ABSL_FLAG(int64_t, max_num_seqs, 256, "generate: sequences decoded together at most");
ABSL_FLAG(int64_t, max_model_len, 0, "generate: prompt + response tokens per sequence at most");
ABSL_FLAG(double, gpu_memory_utilization, 0.6,
          "generate: share of free GPU memory for the KV cache");
ABSL_FLAG(std::string, out, "", "export: directory to write");

namespace rlhfd {
namespace {

constexpr char kUsage[] =
    R"(rlhfd-infer COMMAND --model DIR [flags]: check a Hugging Face model directory by hand.
  rlhfd-infer tokenize --model DIR --text TEXT [--chat] [--add_special_tokens]
      token ids of the text (with --chat, as one user turn in the chat template)
  rlhfd-infer logprobs --model DIR --text TEXT [--prompt TEXT] [--dtype fp32|bf16] [--device cpu|cuda]
      log-probability of every token of --text after --prompt
  rlhfd-infer generate --model DIR --prompts FILE.jsonl [--temperature T --top_k K --top_p P
                       --seed S --max_new_tokens N --n N --stop_token_ids A,B --ignore_eos]
      responses to each prompt line, one JSON line per sample
  rlhfd-infer export --model DIR --out DIR [--dtype fp32|bf16]
      the model re-written as a Hugging Face directory
Prints JSON. Exit codes: 0 success, 1 the model or input is unusable (the message says why), 2 usage.
)";

absl::StatusOr<nlohmann::json> Tokenize(const std::string& dir) {
  ASSIGN_OR_RETURN(model::Tokenizer tokenizer, model::Tokenizer::Load(dir));
  std::string text = absl::GetFlag(FLAGS_text);
  if (absl::GetFlag(FLAGS_chat)) {
    ASSIGN_OR_RETURN(text, tokenizer.ApplyChatTemplate({{"user", text}}, true));
  }
  ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                   tokenizer.Encode(text, absl::GetFlag(FLAGS_add_special_tokens)));
  nlohmann::json tokens = nlohmann::json::array();
  for (int32_t id : ids) tokens.push_back(tokenizer.Decode({id}));
  return nlohmann::json{{"text", text}, {"ids", ids}, {"tokens", tokens}, {"count", ids.size()}};
}

// --dtype and --device as load options.
absl::StatusOr<model::LoadOptions> DeviceOptions() {
  model::LoadOptions options;
  const std::string dtype = absl::GetFlag(FLAGS_dtype), device = absl::GetFlag(FLAGS_device);
  if (dtype != "fp32" && dtype != "bf16")
    return absl::InvalidArgumentError("--dtype: fp32 or bf16");
  options.dtype = dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  if (device == "cuda") {
    if (!torch::cuda::is_available()) return absl::FailedPreconditionError("--device=cuda: no GPU");
    options.device = at::Device(at::kCUDA, 0);
  } else if (device != "cpu") {
    return absl::InvalidArgumentError("--device: cpu or cuda");
  }
  return options;
}

absl::StatusOr<nlohmann::json> Logprobs(const std::string& dir) {
  ASSIGN_OR_RETURN(model::Tokenizer tokenizer, model::Tokenizer::Load(dir));
  ASSIGN_OR_RETURN(model::LoadOptions options, DeviceOptions());
  const std::string dtype = absl::GetFlag(FLAGS_dtype), device = absl::GetFlag(FLAGS_device);
  ASSIGN_OR_RETURN(std::vector<int32_t> prompt_ids, tokenizer.Encode(absl::GetFlag(FLAGS_prompt)));
  ASSIGN_OR_RETURN(std::vector<int32_t> text_ids, tokenizer.Encode(absl::GetFlag(FLAGS_text)));
  std::vector<int64_t> ids(prompt_ids.begin(), prompt_ids.end());
  ids.insert(ids.end(), text_ids.begin(), text_ids.end());
  if (ids.size() < 2 || text_ids.empty()) {
    return absl::InvalidArgumentError("need at least two tokens, and some --text to score");
  }
  options.head = model::HeadNeed::kCausalLm;
  options.max_sequence_length = static_cast<int64_t>(ids.size());
  options.sequence_what = "--prompt and --text together";
  ASSIGN_OR_RETURN(model::Transformer model, model::LoadModel(dir, options));
  RETURN_IF_ERROR(model::CheckTokenizerFitsModel(tokenizer, model->config().vocab_size, dir));
  const at::Tensor id_tensor = at::tensor(ids, at::kLong);
  RETURN_IF_ERROR(model::CheckTokenIds(id_tensor, model->config().vocab_size, "--text"));
  torch::NoGradGuard no_grad;
  at::Tensor input = id_tensor.unsqueeze(0).to(options.device);                         // (1, T)
  at::Tensor logits = model->Logits(model->Hidden({input})).to(at::kFloat).squeeze(0);  // (T, V)
  at::Tensor logp = at::log_softmax(logits, -1).cpu();
  nlohmann::json tokens = nlohmann::json::array();
  double total = 0;
  // Token i is predicted at position i - 1; the first token of the sequence has no prediction.
  const size_t first = std::max<size_t>(prompt_ids.size(), 1);
  for (size_t i = first; i < ids.size(); ++i) {
    const double value = logp[i - 1][ids[i]].item<double>();
    total += value;
    tokens.push_back({{"id", ids[i]},
                      {"token", tokenizer.Decode({static_cast<int32_t>(ids[i])})},
                      {"logprob", value}});
  }
  return nlohmann::json{
      {"tokens", tokens}, {"total_logprob", total}, {"dtype", dtype}, {"device", device}};
}

// One prompt line of --prompts as token ids.
absl::StatusOr<std::vector<int64_t>> PromptIds(const nlohmann::json& line,
                                               const model::Tokenizer& tokenizer) {
  if (!line.is_object()) return absl::InvalidArgumentError("not a JSON object");
  if (line.contains("prompt_ids")) {
    if (!line["prompt_ids"].is_array()) return absl::InvalidArgumentError("prompt_ids: not a list");
    std::vector<int64_t> ids;
    for (const auto& id : line["prompt_ids"]) {
      if (!id.is_number_integer()) return absl::InvalidArgumentError("prompt_ids: not integers");
      ids.push_back(id.get<int64_t>());
    }
    return ids;
  }
  std::string text;
  if (line.contains("messages")) {
    std::vector<model::ChatMessage> messages;
    for (const auto& message : line["messages"]) {
      if (!message.is_object() || !message.contains("role") || !message.contains("content") ||
          !message["role"].is_string() || !message["content"].is_string()) {
        return absl::InvalidArgumentError("messages: each needs string role and content");
      }
      messages.push_back(
          {message["role"].get<std::string>(), message["content"].get<std::string>()});
    }
    ASSIGN_OR_RETURN(text, tokenizer.ApplyChatTemplate(messages, /*add_generation_prompt=*/true));
  } else if (line.contains("prompt") && line["prompt"].is_string()) {
    text = line["prompt"].get<std::string>();
  } else {
    return absl::InvalidArgumentError("needs \"prompt\" (text), \"messages\" or \"prompt_ids\"");
  }
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer.Encode(text));
  return std::vector<int64_t>(ids.begin(), ids.end());
}

// Prints one JSON line per sample; returns the engine's figures for stderr.
absl::StatusOr<nlohmann::json> Generate(const std::string& dir) {
  const std::string path = absl::GetFlag(FLAGS_prompts);
  if (path.empty()) return absl::InvalidArgumentError("generate needs --prompts=FILE.jsonl");
  ASSIGN_OR_RETURN(model::Tokenizer tokenizer, model::Tokenizer::Load(dir));
  rollout::SamplingParams sampling;
  sampling.temperature = absl::GetFlag(FLAGS_temperature);
  sampling.top_k = absl::GetFlag(FLAGS_top_k);
  sampling.top_p = absl::GetFlag(FLAGS_top_p);
  sampling.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  sampling.n = absl::GetFlag(FLAGS_n);
  sampling.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  for (const std::string& id : absl::GetFlag(FLAGS_stop_token_ids)) {
    int64_t value = 0;
    if (!absl::SimpleAtoi(id, &value)) {
      return absl::InvalidArgumentError(absl::StrCat("--stop_token_ids: '", id, "' is not an id"));
    }
    sampling.stop_token_ids.push_back(value);
  }
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat("--prompts: cannot open ", path));
  std::vector<rollout::GenerationRequest> requests;
  std::string text;
  for (int line_number = 1; std::getline(file, text); ++line_number) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json line = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (line.is_discarded()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_number, ": invalid JSON"));
    }
    auto ids = PromptIds(line, tokenizer);
    if (!ids.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_number, ": ", ids.status().message()));
    }
    rollout::GenerationRequest request{std::move(*ids), sampling};
    const int64_t seed = absl::GetFlag(FLAGS_seed);
    if (seed >= 0) request.sampling.seed = static_cast<uint64_t>(seed) + requests.size();
    requests.push_back(std::move(request));
  }
  if (requests.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no prompts"));

  ASSIGN_OR_RETURN(model::LoadOptions options, DeviceOptions());
  options.head = model::HeadNeed::kCausalLm;
  size_t longest_prompt = 0;
  for (const rollout::GenerationRequest& request : requests) {
    longest_prompt = std::max(longest_prompt, request.prompt_ids.size());
  }
  options.max_sequence_length =
      absl::GetFlag(FLAGS_max_model_len) > 0
          ? absl::GetFlag(FLAGS_max_model_len)
          : static_cast<int64_t>(longest_prompt) + absl::GetFlag(FLAGS_max_new_tokens);
  options.sequence_what = "the longest prompt + --max_new_tokens (or --max_model_len)";
  ASSIGN_OR_RETURN(model::Transformer model, model::LoadModel(dir, options));
  RETURN_IF_ERROR(model::CheckTokenizerFitsModel(tokenizer, model->config().vocab_size, dir));
  rollout::EngineOptions engine_options;
  engine_options.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  // Slots as long as this run needs, not the model's context (its KV cache would not fit).
  engine_options.max_model_len = options.max_sequence_length;
  engine_options.gpu_memory_utilization = absl::GetFlag(FLAGS_gpu_memory_utilization);
  if (absl::GetFlag(FLAGS_seed) >= 0) engine_options.seed = absl::GetFlag(FLAGS_seed);
  ASSIGN_OR_RETURN(auto engine, rollout::GenerationEngine::Create(model, engine_options));
  ASSIGN_OR_RETURN(std::vector<rollout::GenerationResult> results, engine->Generate(requests));
  for (size_t i = 0; i < results.size(); ++i) {
    for (size_t j = 0; j < results[i].samples.size(); ++j) {
      const rollout::Completion& sample = results[i].samples[j];
      const std::vector<int32_t> ids(sample.token_ids.begin(), sample.token_ids.end());
      std::cout << nlohmann::json{{"index", i},
                                  {"sample", j},
                                  {"text", tokenizer.Decode(ids)},
                                  {"token_ids", sample.token_ids},
                                  {"logprobs", sample.logprobs},
                                  {"finish_reason",
                                   rollout::FinishReasonName(sample.finish_reason)}}
                       .dump()
                << "\n";
    }
  }
  const rollout::EngineStats& stats = engine->stats();
  return nlohmann::json{{"prompts", stats.prompts},
                        {"generated_tokens", stats.generated_tokens},
                        {"prefill_seconds", stats.prefill_seconds},
                        {"decode_seconds", stats.decode_seconds},
                        {"decode_steps", stats.decode_steps},
                        {"cache_blocks", stats.cache_blocks},
                        {"peak_running", stats.peak_running},
                        {"preemptions", stats.preemptions}};
}

absl::StatusOr<nlohmann::json> Export(const std::string& dir) {
  const std::string out = absl::GetFlag(FLAGS_out), dtype = absl::GetFlag(FLAGS_dtype);
  if (out.empty()) return absl::InvalidArgumentError("export needs --out=DIR");
  if (dtype != "fp32" && dtype != "bf16")
    return absl::InvalidArgumentError("--dtype: fp32 or bf16");
  model::LoadOptions options;
  options.max_sequence_length = model::LoadOptions::kNoForward;
  ASSIGN_OR_RETURN(model::Transformer model, model::LoadModel(dir, options));
  RETURN_IF_ERROR(model::ExportHuggingFaceDirectory(model, dir, out,
                                                    dtype == "bf16" ? at::kBFloat16 : at::kFloat));
  return nlohmann::json{{"exported", out}, {"dtype", dtype}};
}

}  // namespace
}  // namespace rlhfd

int main(int argc, char** argv) {
  rlhfd::SetUpProgram();
  rlhfd::HandleHelp(argc, argv, rlhfd::kUsage);
  absl::SetProgramUsageMessage(rlhfd::kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2 || absl::GetFlag(FLAGS_model).empty()) {
    std::cerr << rlhfd::kUsage;
    return 2;
  }
  const std::string command = args[1];
  absl::StatusOr<nlohmann::json> result;
  // The tool's boundary: a library error (an allocation, a kernel) ends the command with its
  // message, never with a signal.
  try {
    result = command == "tokenize"   ? rlhfd::Tokenize(absl::GetFlag(FLAGS_model))
             : command == "logprobs" ? rlhfd::Logprobs(absl::GetFlag(FLAGS_model))
             : command == "generate" ? rlhfd::Generate(absl::GetFlag(FLAGS_model))
             : command == "export"   ? rlhfd::Export(absl::GetFlag(FLAGS_model))
                                     : absl::InvalidArgumentError(absl::StrCat(
                                           "unknown command '", command, "'\n", rlhfd::kUsage));
  } catch (const std::exception& error) {
    result = absl::InternalError(std::string(error.what()).substr(0, 2000));
  }
  if (!result.ok()) {
    std::cerr << "error: " << result.status().message() << "\n";
    const bool known = command == "tokenize" || command == "logprobs" || command == "generate" ||
                       command == "export";
    return known ? 1 : 2;
  }
  // generate has printed its JSON lines; its summary goes to stderr.
  (command == "generate" ? std::cerr : std::cout) << result->dump(1) << "\n";
  return 0;
}
