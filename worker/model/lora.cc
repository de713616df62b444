#include "worker/model/lora.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/models/lora_targets.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"
#include "worker/model/safetensors_writer.h"
#include "worker/model/state_dict.h"

namespace rlhfd::model {
namespace {

// PEFT's names in adapter_model.safetensors: the model's, under PeftModel's base_model.model.
constexpr char kPeftPrefix[] = "base_model.model.";
constexpr char kAdapterConfig[] = "adapter_config.json";
constexpr char kAdapterWeights[] = "adapter_model.safetensors";

// The model's linear layers that carry an adapter (transformer.h's AdapterOf), by module name,
// in parameter order.
std::vector<std::pair<std::string, LowRankAdapter>> AdaptedLayers(Transformer& model) {
  std::vector<std::pair<std::string, LowRankAdapter>> found;
  for (const auto& item : model->named_modules()) {
    auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(item.value());
    if (linear == nullptr) continue;
    LowRankAdapter adapter = AdapterOf(torch::nn::Linear(linear), /*scaling=*/1.0);
    if (adapter.a.defined()) found.emplace_back(item.key(), std::move(adapter));
  }
  return found;
}

}  // namespace

double LoraOptions::scaling() const {
  if (rank <= 0) return 0;
  return rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

bool IsLoraParameter(const std::string& name) {
  return absl::StrContains(name, ".lora_A.") || absl::StrContains(name, ".lora_B.");
}

absl::Status AddLoraAdapters(Transformer& model, const LoraOptions& options, uint64_t seed) {
  if (options.rank < 1) {
    return absl::InvalidArgumentError(absl::StrCat("LoRA rank ", options.rank, " must be >= 1"));
  }
  RETURN_IF_ERROR(models::ResolveLoraTargets(options.layers).status());
  if (!AdaptedLayers(model).empty()) {
    return absl::FailedPreconditionError("the model has LoRA adapters already");
  }
  const std::set<std::string> targets(options.layers.begin(), options.layers.end());
  // One generator for every adapter, in module order: the same seed gives every replica (and a
  // resumed run) the same adapters.
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  torch::NoGradGuard no_grad;
  for (const auto& item : model->named_modules()) {
    auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(item.value());
    if (linear == nullptr) continue;
    const std::string& name = item.key();
    const std::string layer_name(name.substr(name.rfind('.') + 1));
    if (!absl::StartsWith(name, "model.layers.") || !targets.count(layer_name)) continue;
    const at::Tensor& weight = linear->weight;
    const int64_t out = weight.size(0), in = weight.size(1);
    const at::ScalarType dtype = weight.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    auto a = torch::nn::Linear(torch::nn::LinearOptions(in, options.rank).bias(false));
    auto b = torch::nn::Linear(torch::nn::LinearOptions(options.rank, out).bias(false));
    a->weight.set_data(
        at::empty({options.rank, in}, at::kDouble).uniform_(-bound, bound, generator).to(dtype));
    b->weight.set_data(at::zeros({out, options.rank}, dtype));
    a->to(weight.device());
    b->to(weight.device());
    linear->register_module("lora_A", a);
    linear->register_module("lora_B", b);
  }
  for (auto& item : model->named_parameters()) {
    item.value().requires_grad_(IsLoraParameter(item.key()));
  }
  model->set_adapter_scaling(options.scaling());
  return absl::OkStatus();
}

bool HasLoraAdapters(Transformer& model) { return model->adapter_scaling() != 0; }

std::vector<at::Tensor> TrainableParameters(Transformer& model) {
  std::vector<at::Tensor> trainable;
  for (const at::Tensor& p : model->parameters()) {
    if (p.requires_grad()) trainable.push_back(p);
  }
  return trainable;
}

std::vector<std::pair<std::string, at::Tensor>> MergedParameters(Transformer& model) {
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> adapters;  // layer weight → (A, B)
  for (const auto& [name, adapter] : AdaptedLayers(model)) {
    adapters[name + ".weight"] = {adapter.a, adapter.b};
  }
  const double scaling = model->adapter_scaling();
  std::vector<std::pair<std::string, at::Tensor>> merged;
  torch::NoGradGuard no_grad;
  for (const auto& item : model->named_parameters()) {
    if (IsLoraParameter(item.key())) continue;
    auto adapter = adapters.find(item.key());
    if (adapter == adapters.end() || scaling == 0) {
      merged.emplace_back(item.key(), item.value());
      continue;
    }
    // PEFT's merge: the delta (B A) scaled in the adapters' precision, added to W in W's.
    const auto& [a, b] = adapter->second;
    const at::Tensor& weight = item.value();
    const at::Tensor delta = at::matmul(b, a) * scaling;
    merged.emplace_back(item.key(), (weight.to(delta.scalar_type()) + delta).to(weight.dtype()));
  }
  return merged;
}

AdaptersOff::AdaptersOff(Transformer& model)
    : model_(model), was_enabled_(model->adapters_enabled()) {
  model_->set_adapters_enabled(false);
}

AdaptersOff::~AdaptersOff() { model_->set_adapters_enabled(was_enabled_); }

absl::StatusOr<LoraOptions> ReadPeftAdapterConfig(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kAdapterConfig);
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path, 16 << 20));
  const nlohmann::json config = nlohmann::json::parse(text, nullptr, false);
  if (!config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  const auto refuse = [&](absl::string_view key, absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", key, " ", why));
  };
  const auto value_or = [&](const char* key, const nlohmann::json& fallback) {
    auto it = config.find(key);
    return it == config.end() || it->is_null() ? fallback : *it;
  };
  if (value_or("peft_type", "LORA") != "LORA") {
    return refuse("peft_type", absl::StrCat(value_or("peft_type", "").dump(), " is not LORA"));
  }
  if (value_or("use_dora", false) != false) return refuse("use_dora", "is true: DoRA is not run");
  if (value_or("bias", "none") != "none") {
    return refuse("bias", "is not \"none\": adapter biases are not run");
  }
  if (value_or("fan_in_fan_out", false) != false) {
    return refuse("fan_in_fan_out", "is true: only (out, in) linear weights are adapted");
  }
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    if (!value_or(key, nlohmann::json::object()).empty()) {
      return refuse(key, "is set: every adapted layer has one rank and alpha here");
    }
  }
  for (const char* key : {"modules_to_save", "layers_to_transform", "layers_pattern"}) {
    const nlohmann::json value = value_or(key, nullptr);
    if (!value.is_null() && !(value.is_array() && value.empty())) {
      return refuse(key, "is set: every decoder layer's target modules are adapted, nothing else");
    }
  }
  LoraOptions options;
  const nlohmann::json rank = value_or("r", nullptr);
  const nlohmann::json alpha = value_or("lora_alpha", nullptr);
  if (!rank.is_number_integer() || rank.get<int64_t>() < 1) {
    return refuse("r", "must be an integer >= 1");
  }
  if (!alpha.is_number() || !(alpha.get<double>() > 0)) {
    return refuse("lora_alpha", "must be a positive number");
  }
  options.rank = rank.get<int64_t>();
  options.alpha = alpha.get<double>();
  options.rslora = value_or("use_rslora", false) == true;
  const nlohmann::json targets = value_or("target_modules", nullptr);
  // PEFT saves "all-linear" as the full paths of the modules it adapted
  // ("model.layers.0.self_attn.q_proj"): the layer is the last part. Which decoder layers hold
  // them is checked when the tensors load.
  std::vector<std::string> names;
  const auto add = [&](const std::string& name) {
    std::string layer = name == "all-linear" ? name : name.substr(name.rfind('.') + 1);
    if (std::find(names.begin(), names.end(), layer) == names.end()) names.push_back(layer);
  };
  if (targets.is_string()) {
    add(targets.get<std::string>());
  } else if (targets.is_array()) {
    for (const nlohmann::json& name : targets) {
      if (!name.is_string()) return refuse("target_modules", "must hold names");
      add(name.get<std::string>());
    }
  }
  absl::StatusOr<std::vector<std::string>> layers = models::ResolveLoraTargets(names);
  if (!layers.ok()) {
    return refuse("target_modules", absl::StripPrefix(layers.status().message(), "target_modules: "));
  }
  options.layers = *std::move(layers);
  return options;
}

absl::Status LoadPeftAdapter(Transformer& model, const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kAdapterWeights);
  ASSIGN_OR_RETURN(const StateDict file, StateDict::Load(path));
  std::vector<std::string> missing, mismatched, unexpected;
  std::set<std::string> expected;
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    if (!IsLoraParameter(item.key())) continue;
    const std::string name = kPeftPrefix + item.key();
    expected.insert(name);
    absl::StatusOr<at::Tensor> tensor = file.Get(name);
    if (!tensor.ok()) {
      missing.push_back(name);
    } else if (tensor->sizes() != item.value().sizes()) {
      mismatched.push_back(absl::StrCat(name, " (file ", ShapeString(tensor->sizes()),
                                        ", model ", ShapeString(item.value().sizes()), ")"));
    } else {
      item.value().copy_(*tensor);
    }
  }
  for (const std::string& name : file.names()) {
    if (!expected.count(name)) unexpected.push_back(name);
  }
  if (expected.empty()) {
    return absl::FailedPreconditionError("the model has no LoRA adapters to load into");
  }
  return TensorMismatch(absl::StrCat(path, " does not match the model's adapters:"), missing,
                        unexpected, mismatched);
}

absl::Status WritePeftAdapter(Transformer& model, const LoraOptions& options,
                              const std::string& base_model, const std::string& dir) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& item : model->named_parameters()) {
    if (IsLoraParameter(item.key())) {
      tensors.emplace_back(kPeftPrefix + item.key(), item.value().detach());
    }
  }
  if (tensors.empty()) {
    return absl::FailedPreconditionError("the model has no LoRA adapters to write");
  }
  RETURN_IF_ERROR(MakeDirectories(dir));
  RETURN_IF_ERROR(WriteSafetensors(absl::StrCat(dir, "/", kAdapterWeights), tensors));
  const nlohmann::json config = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base_model},
      {"r", options.rank},
      {"lora_alpha", options.alpha},
      {"use_rslora", options.rslora},
      {"target_modules", options.layers},
      {"lora_dropout", 0.0},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"use_dora", false},
      {"init_lora_weights", true},
      {"inference_mode", true},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", nlohmann::json::object()},
      {"alpha_pattern", nlohmann::json::object()},
  };
  return WriteFileAtomically(absl::StrCat(dir, "/", kAdapterConfig), config.dump(2) + "\n");
}

}  // namespace rlhfd::model
