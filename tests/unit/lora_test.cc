// LoRA adapters (worker/model/lora.h) against PEFT 0.21.2 (tests/lora/peft_reference.py runs it
// on the same fixture model, in float32): an adapter PEFT made and saved, loaded here, gives
// PEFT's log-probs, its log-probs with the adapter disabled, its adapter gradients and its
// merge_and_unload() weights; an adapter written here loads in PEFT, and the merged export in
// transformers, with this model's log-probs. Tolerances: 1e-5 on log-probs and gradients, 1e-6 on
// merged weights (float32 over the same fixture: what differs is the order of the sums).
#include "worker/model/lora.h"

#include <ATen/ATen.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/util/files.h"
#include "tests/support/subprocess.h"
#include "worker/model/model_export.h"
#include "worker/model/model_loader.h"
#include "worker/model/safetensors_writer.h"
#include "worker/model/state_dict.h"

namespace rlhfd::model {
namespace {

using rlhfd::testing::CommandResult;
using rlhfd::testing::RunCommand;
using rlhfd::testing::TempDir;

const std::string kModel = std::string(RLHFD_FIXTURES_DIR) + "/models/tiny-qwen2";
const std::string kScript = std::string(RLHFD_SOURCE_DIR) + "/tests/lora/peft_reference.py";

std::string RunPython(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {RLHFD_PYTHON, kScript};
  argv.insert(argv.end(), args.begin(), args.end());
  const CommandResult result = RunCommand(argv, absl::Seconds(240));
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  return result.out;
}

Transformer Load() {
  absl::StatusOr<Transformer> model = LoadModel(kModel, LoadOptions{});
  INFO(model.status());
  REQUIRE(model.ok());
  return *model;
}

// The log-prob of each next token, 0 where it or the position predicting it is padding:
// peft_reference.py's next_token_log_probs.
at::Tensor NextTokenLogProbs(Transformer& model, const at::Tensor& ids, const at::Tensor& mask) {
  const at::Tensor logits = model->Logits(model->Hidden({.input_ids = ids, .attention_mask = mask}));
  const int64_t t = ids.size(1);
  const at::Tensor log_probs = at::log_softmax(logits.narrow(1, 0, t - 1), -1);
  return log_probs.gather(-1, ids.narrow(1, 1, t - 1).unsqueeze(-1)).squeeze(-1) *
         mask.narrow(1, 1, t - 1) * mask.narrow(1, 0, t - 1);
}

double MaxDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

at::Tensor Get(const StateDict& file, const std::string& name) {
  absl::StatusOr<at::Tensor> tensor = file.Get(name);
  INFO(tensor.status());
  REQUIRE(tensor.ok());
  return tensor->clone();
}

// A model with PEFT's adapter from `dir`/adapter loaded, as a job's lora_adapter_path does.
Transformer Adapted(const std::string& dir, LoraOptions* options_out = nullptr) {
  absl::StatusOr<LoraOptions> options = ReadPeftAdapterConfig(dir + "/adapter");
  INFO(options.status());
  REQUIRE(options.ok());
  Transformer model = Load();
  REQUIRE(AddLoraAdapters(model, *options, /*seed=*/3).ok());
  const absl::Status loaded = LoadPeftAdapter(model, dir + "/adapter");
  INFO(loaded);
  REQUIRE(loaded.ok());
  if (options_out != nullptr) *options_out = *options;
  return model;
}

TEST_CASE("a PEFT adapter gives PEFT's log-probs, gradients and merged weights", "[lora]") {
  TempDir dir;
  RunPython({"make", kModel, dir.path()});
  absl::StatusOr<StateDict> reference = StateDict::Load(dir.path() + "/reference.safetensors");
  REQUIRE(reference.ok());
  const at::Tensor ids = Get(*reference, "input_ids");
  const at::Tensor mask = Get(*reference, "attention_mask");
  LoraOptions options;
  Transformer model = Adapted(dir.path(), &options);
  CHECK(options.rank == 4);
  CHECK(options.alpha == 8);
  CHECK(options.layers.size() == 7);

  // Only the adapters train: 7 layers x 2 decoder layers x (A, B).
  CHECK(TrainableParameters(model).size() == 28);
  for (const auto& item : model->named_parameters()) {
    CHECK(item.value().requires_grad() == IsLoraParameter(item.key()));
  }

  const at::Tensor log_probs = NextTokenLogProbs(model, ids, mask);
  CHECK(MaxDiff(log_probs, Get(*reference, "log_probs")) <= 1e-5);
  {
    AdaptersOff off(model);
    at::NoGradGuard no_grad;
    CHECK(MaxDiff(NextTokenLogProbs(model, ids, mask), Get(*reference, "base_log_probs")) <= 1e-5);
  }
  // The adapters' gradients of the weighted sum PEFT differentiated.
  (log_probs * Get(*reference, "loss_weights")).sum().backward();
  int gradients = 0;
  for (const auto& item : model->named_parameters()) {
    if (!IsLoraParameter(item.key())) {
      CHECK_FALSE(item.value().grad().defined());
      continue;
    }
    const at::Tensor expected = Get(*reference, "grad.base_model.model." + item.key());
    INFO(item.key() << " max |grad| " << expected.abs().max().item<double>());
    CHECK(MaxDiff(item.value().grad(), expected) <= 1e-5);
    ++gradients;
  }
  CHECK(gradients == 28);

  // merge_and_unload(): every weight of the plain model, adapted ones merged.
  const auto merged = MergedParameters(model);
  CHECK(merged.size() == Load()->named_parameters().size());
  for (const auto& [name, tensor] : merged) {
    INFO(name);
    CHECK(MaxDiff(tensor, Get(*reference, "merged." + name)) <= 1e-6);
  }
}

TEST_CASE("rsLoRA on a subset of the layers", "[lora]") {
  TempDir dir;
  RunPython({"make", kModel, dir.path(), "8", "16", "1", "q_proj,v_proj,down_proj"});
  absl::StatusOr<StateDict> reference = StateDict::Load(dir.path() + "/reference.safetensors");
  REQUIRE(reference.ok());
  LoraOptions options;
  Transformer model = Adapted(dir.path(), &options);
  CHECK(options.rslora);
  CHECK(options.layers == std::vector<std::string>{"q_proj", "v_proj", "down_proj"});
  CHECK(options.scaling() == Approx(16 / std::sqrt(8.0)));
  CHECK(TrainableParameters(model).size() == 12);
  at::NoGradGuard no_grad;
  CHECK(MaxDiff(NextTokenLogProbs(model, Get(*reference, "input_ids"),
                                  Get(*reference, "attention_mask")),
                Get(*reference, "log_probs")) <= 1e-5);
}

TEST_CASE("an adapter written here loads in PEFT, and the merged export in transformers",
          "[lora]") {
  TempDir dir;
  RunPython({"make", kModel, dir.path()});
  absl::StatusOr<StateDict> reference = StateDict::Load(dir.path() + "/reference.safetensors");
  REQUIRE(reference.ok());
  LoraOptions options;
  Transformer model = Adapted(dir.path(), &options);
  // Moved off PEFT's values, so that the check sees what was written, not what was read.
  {
    at::NoGradGuard no_grad;
    for (at::Tensor& p : TrainableParameters(model)) p.mul_(1.5);
  }
  const at::Tensor ids = Get(*reference, "input_ids");
  const at::Tensor mask = Get(*reference, "attention_mask");
  at::Tensor log_probs;
  {
    at::NoGradGuard no_grad;
    log_probs = NextTokenLogProbs(model, ids, mask);
  }
  const std::string ours = dir.path() + "/ours.safetensors";
  REQUIRE(WriteSafetensors(ours, {{"input_ids", ids},
                                  {"attention_mask", mask},
                                  {"rlhfd_log_probs", log_probs}})
              .ok());
  const std::string adapter = dir.path() + "/exported";
  REQUIRE(WritePeftAdapter(model, options, kModel, adapter).ok());
  nlohmann::json peft = nlohmann::json::parse(RunPython({"logprobs", kModel, adapter, ours}));
  INFO(peft.dump());
  CHECK(peft["max_abs_diff"].get<double>() <= 1e-5);

  const std::string merged = dir.path() + "/merged";
  REQUIRE(ExportHuggingFaceDirectory(model, kModel, merged, at::kFloat).ok());
  nlohmann::json plain = nlohmann::json::parse(RunPython({"logprobs", merged, "-", ours}));
  INFO(plain.dump());
  CHECK(plain["max_abs_diff"].get<double>() <= 1e-5);
}

TEST_CASE("fresh adapters leave the model as it was, and a seed gives the same ones", "[lora]") {
  const LoraOptions options{.rank = 8, .alpha = 16, .layers = {"q_proj", "up_proj"}};
  Transformer base = Load();
  Transformer adapted = Load();
  Transformer again = Load();
  REQUIRE(AddLoraAdapters(adapted, options, 5).ok());
  REQUIRE(AddLoraAdapters(again, options, 5).ok());
  const at::Tensor ids = at::arange(1, 11, at::kLong).view({1, 10});
  const at::Tensor mask = at::ones_like(ids);
  at::NoGradGuard no_grad;
  CHECK(MaxDiff(NextTokenLogProbs(adapted, ids, mask), NextTokenLogProbs(base, ids, mask)) == 0);
  auto named = adapted->named_parameters();
  auto named_again = again->named_parameters();
  const at::Tensor a = named["model.layers.0.mlp.up_proj.lora_A.weight"];
  CHECK(a.sizes() == at::IntArrayRef({8, 64}));
  CHECK(a.abs().max().item<double>() <= 1 / std::sqrt(64.0));
  CHECK(a.std().item<double>() > 0.5 / std::sqrt(3 * 64.0));  // uniform, not collapsed
  CHECK(at::equal(a, named_again["model.layers.0.mlp.up_proj.lora_A.weight"]));
  CHECK(named["model.layers.1.self_attn.q_proj.lora_B.weight"].abs().max().item<double>() == 0);
  CHECK_FALSE(named.contains("model.layers.0.self_attn.k_proj.lora_A.weight"));
  CHECK(AddLoraAdapters(adapted, options, 5).code() == absl::StatusCode::kFailedPrecondition);
  CHECK(AddLoraAdapters(base, LoraOptions{.rank = 0, .layers = {"q_proj"}}, 5).code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("adapter directories rlhfd cannot run the same way are refused naming the key",
          "[lora]") {
  TempDir dir;
  RunPython({"make", kModel, dir.path()});
  const std::string adapter = dir.path() + "/adapter";
  const std::string config_path = adapter + "/adapter_config.json";
  absl::StatusOr<std::string> text = ReadFileToString(config_path, 1 << 20);
  REQUIRE(text.ok());
  const nlohmann::json original = nlohmann::json::parse(*text);
  const auto refused = [&](const std::string& key, const nlohmann::json& value) {
    nlohmann::json config = original;
    config[key] = value;
    REQUIRE(WriteFileAtomically(config_path, config.dump()).ok());
    absl::StatusOr<LoraOptions> options = ReadPeftAdapterConfig(adapter);
    REQUIRE(WriteFileAtomically(config_path, original.dump()).ok());
    INFO(options.status());
    return options.status().code() == absl::StatusCode::kInvalidArgument &&
           absl::StrContains(options.status().message(), key) &&
           absl::StrContains(options.status().message(), "adapter_config.json");
  };
  CHECK(refused("use_dora", true));
  CHECK(refused("bias", "all"));
  CHECK(refused("rank_pattern", {{"q_proj", 8}}));
  CHECK(refused("modules_to_save", {"lm_head"}));
  CHECK(refused("layers_to_transform", {0}));
  CHECK(refused("target_modules", {"lm_head"}));
  CHECK(refused("r", 0));
  CHECK(refused("peft_type", "IA3"));

  // Tensors that do not fit the adapters made from the job's options: each named.
  Transformer model = Load();
  REQUIRE(AddLoraAdapters(model, LoraOptions{.rank = 8, .alpha = 16, .layers = {"q_proj", "gate_proj"}}, 1).ok());
  const absl::Status loaded = LoadPeftAdapter(model, adapter);
  CHECK(loaded.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StrContains(loaded.message(), "wrong shape: base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight (file [4, 64], model [8, 64])"));
  CHECK(absl::StrContains(loaded.message(), "unexpected: base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"));
  Transformer plain = Load();
  CHECK(LoadPeftAdapter(plain, adapter).code() == absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace rlhfd::model
