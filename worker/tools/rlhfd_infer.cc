// rlhfd-infer: check a Hugging Face model directory by hand. Prints JSON.
//   rlhfd-infer tokenize --model DIR --text "..." [--chat] [--add_special_tokens]
//   rlhfd-infer logprobs --model DIR --text "..." [--prompt "..."] [--dtype fp32|bf16]
//                        [--device cpu|cuda]
//   rlhfd-infer export --model DIR --out DIR [--dtype fp32|bf16]
// Exit codes: 0 success, 1 the model or input is unusable (the message says why), 2 usage.
#include <ATen/ATen.h>
#include <torch/cuda.h>
#include <torch/types.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "worker/model/model_export.h"
#include "worker/model/model_loader.h"
#include "worker/model/tokenizer.h"

ABSL_FLAG(std::string, model, "", "Hugging Face model directory");
ABSL_FLAG(std::string, text, "", "Text to tokenize or score");
ABSL_FLAG(std::string, prompt, "",
          "logprobs: text before --text that is conditioned on but not scored");
ABSL_FLAG(bool, chat, false, "tokenize: wrap --text as one user turn in the chat template");
ABSL_FLAG(bool, add_special_tokens, false, "tokenize: add the post-processor's special tokens");
ABSL_FLAG(std::string, dtype, "fp32", "logprobs: fp32 or bf16");
ABSL_FLAG(std::string, device, "cpu", "logprobs: cpu or cuda");
ABSL_FLAG(std::string, out, "", "export: directory to write");

namespace rlhfd {
namespace {

constexpr char kUsage[] = R"(rlhfd-infer COMMAND --model DIR --text TEXT [flags]
  tokenize   token ids of the text (--chat, --add_special_tokens)
  logprobs   log-probability of every token of the text under the model (--prompt, --dtype, --device)
  export     re-write the model as a Hugging Face directory (--out, --dtype)
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

absl::StatusOr<nlohmann::json> Logprobs(const std::string& dir) {
  ASSIGN_OR_RETURN(model::Tokenizer tokenizer, model::Tokenizer::Load(dir));
  model::LoadOptions options;
  const std::string dtype = absl::GetFlag(FLAGS_dtype), device = absl::GetFlag(FLAGS_device);
  if (dtype != "fp32" && dtype != "bf16") return absl::InvalidArgumentError("--dtype: fp32 or bf16");
  options.dtype = dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  if (device == "cuda") {
    if (!torch::cuda::is_available()) return absl::FailedPreconditionError("--device=cuda: no GPU");
    options.device = at::Device(at::kCUDA, 0);
  } else if (device != "cpu") {
    return absl::InvalidArgumentError("--device: cpu or cuda");
  }
  ASSIGN_OR_RETURN(model::Transformer model, model::LoadModel(dir, options));
  ASSIGN_OR_RETURN(std::vector<int32_t> prompt_ids, tokenizer.Encode(absl::GetFlag(FLAGS_prompt)));
  ASSIGN_OR_RETURN(std::vector<int32_t> text_ids, tokenizer.Encode(absl::GetFlag(FLAGS_text)));
  std::vector<int64_t> ids(prompt_ids.begin(), prompt_ids.end());
  ids.insert(ids.end(), text_ids.begin(), text_ids.end());
  if (ids.size() < 2 || text_ids.empty()) {
    return absl::InvalidArgumentError("need at least two tokens, and some --text to score");
  }
  torch::NoGradGuard no_grad;
  at::Tensor input = at::tensor(ids, at::kLong).unsqueeze(0).to(options.device);  // (1, T)
  at::Tensor logits = model->Logits(model->Hidden({input})).to(at::kFloat).squeeze(0);  // (T, V)
  at::Tensor logp = at::log_softmax(logits, -1).cpu();
  nlohmann::json tokens = nlohmann::json::array();
  double total = 0;
  // Token i is predicted at position i - 1; the first token of the sequence has no prediction.
  const size_t first = std::max<size_t>(prompt_ids.size(), 1);
  for (size_t i = first; i < ids.size(); ++i) {
    const double value = logp[i - 1][ids[i]].item<double>();
    total += value;
    tokens.push_back({{"id", ids[i]}, {"token", tokenizer.Decode({static_cast<int32_t>(ids[i])})},
                      {"logprob", value}});
  }
  return nlohmann::json{{"tokens", tokens}, {"total_logprob", total}, {"dtype", dtype},
                        {"device", device}};
}

absl::StatusOr<nlohmann::json> Export(const std::string& dir) {
  const std::string out = absl::GetFlag(FLAGS_out), dtype = absl::GetFlag(FLAGS_dtype);
  if (out.empty()) return absl::InvalidArgumentError("export needs --out=DIR");
  if (dtype != "fp32" && dtype != "bf16") return absl::InvalidArgumentError("--dtype: fp32 or bf16");
  ASSIGN_OR_RETURN(model::Transformer model, model::LoadModel(dir, {}));
  RETURN_IF_ERROR(model::ExportHuggingFaceDirectory(model, dir, out,
                                                    dtype == "bf16" ? at::kBFloat16 : at::kFloat));
  return nlohmann::json{{"exported", out}, {"dtype", dtype}};
}

}  // namespace
}  // namespace rlhfd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(rlhfd::kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2 || absl::GetFlag(FLAGS_model).empty()) {
    std::cerr << rlhfd::kUsage;
    return 2;
  }
  const std::string command = args[1];
  absl::StatusOr<nlohmann::json> result =
      command == "tokenize"   ? rlhfd::Tokenize(absl::GetFlag(FLAGS_model))
      : command == "logprobs" ? rlhfd::Logprobs(absl::GetFlag(FLAGS_model))
      : command == "export"   ? rlhfd::Export(absl::GetFlag(FLAGS_model))
                              : absl::InvalidArgumentError(absl::StrCat("unknown command '", command,
                                                                        "'\n", rlhfd::kUsage));
  if (!result.ok()) {
    std::cerr << "error: " << result.status().message() << "\n";
    const bool known = command == "tokenize" || command == "logprobs" || command == "export";
    return known ? 1 : 2;
  }
  std::cout << result->dump(1) << "\n";
  return 0;
}
