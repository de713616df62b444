// Submit-time file checks; see submit_checks.h.
#include "controller/jobs/submit_checks.h"

#include <google/protobuf/repeated_ptr_field.h>

#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/config_errors.h"
#include "common/models/architectures.h"
#include "common/util/files.h"
#include "common/util/text.h"
#include "controller/driver/prompt_data.h"

namespace rlhfd::controller {
namespace {

// Looks like a Hugging Face hub id ("Qwen/Qwen2.5-0.5B-Instruct") rather than a path.
bool LooksLikeHubId(const std::string& path) {
  const size_t slash = path.find('/');
  return slash != std::string::npos && slash > 0 &&
         path.find('/', slash + 1) == std::string::npos && path[0] != '.' && path[0] != '~';
}

class FileChecker {
 public:
  FileChecker(const std::string& base_dir, config::ConfigErrors* errors)
      : base_dir_(base_dir), errors_(errors) {}

  // Makes `path` absolute; false (with an error) when it cannot be.
  bool Resolve(const std::string& key, std::string* path) {
    if (path->empty() || (*path)[0] == '/') return true;
    if (base_dir_.empty()) {
      errors_->Add(key, absl::StrCat("'", *path,
                                     "' is relative; give an absolute path (rlhfctl "
                                     "resolves relative paths against its working directory)"));
      return false;
    }
    *path = absl::StrCat(base_dir_, "/", *path);
    return true;
  }

  // A model directory as rlhfd-worker loads it.
  void ModelDirectory(const std::string& key, std::string* path, bool needs_tokenizer) {
    const std::string written = *path;
    if (path->empty() || !Resolve(key, path)) return;
    if (!IsDirectory(*path)) {
      std::string message = absl::StrCat("model directory '", *path, "' not found");
      if (LooksLikeHubId(written)) {
        absl::StrAppend(&message, "; '", written,
                        "' looks like a Hugging Face hub id, which is "
                        "not downloaded: put the model on disk (huggingface-cli download ",
                        written, " --local-dir DIR) and give DIR");
      }
      errors_->Add(key, message);
      return;
    }
    std::vector<std::string> missing;
    if (!PathExists(*path + "/config.json")) missing.push_back("config.json");
    if (needs_tokenizer && !PathExists(*path + "/tokenizer.json"))
      missing.push_back("tokenizer.json");
    bool weights = PathExists(*path + "/model.safetensors") ||
                   PathExists(*path + "/model.safetensors.index.json");
    if (!weights) {
      if (auto names = ListDirectory(*path); names.ok()) {
        for (const std::string& name : *names) weights |= absl::EndsWith(name, ".safetensors");
      }
    }
    if (!weights) missing.push_back("*.safetensors weights");
    if (!missing.empty()) {
      errors_->Add(key, absl::StrCat("'", *path, "' is not a complete model directory: no ",
                                     absl::StrJoin(missing, ", no "),
                                     (PathExists(*path + "/pytorch_model.bin")
                                          ? " (pytorch_model.bin is not read: convert it to "
                                            "safetensors)"
                                          : "")));
      return;
    }
    Architecture(key, *path + "/config.json");
  }

  // config.json names an architecture of the table the workers load from (one family, one
  // head): an unsupported model is refused here, not when the job starts.
  void Architecture(const std::string& key, const std::string& config_path) {
    auto text = ReadFilePrefix(config_path, 1 << 20);
    if (!text.ok()) return;  // ModelDirectory named what is missing
    const nlohmann::json config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    const nlohmann::json* names =
        config.is_object() && config.contains("architectures") ? &config["architectures"] : nullptr;
    if (names == nullptr || !names->is_array() || names->size() != 1 || !(*names)[0].is_string()) {
      errors_->Add(key, absl::StrCat(config_path,
                                     ": 'architectures' must list exactly one "
                                     "architecture"));
      return;
    }
    const std::string name = (*names)[0].get<std::string>();
    if (!models::FindArchitecture(name)) {
      errors_->Add(
          key, absl::StrCat(config_path, ": architecture '", SanitizeForDisplay(name, 80),
                            "' is not supported; supported: ", models::SupportedArchitectures()));
    }
    if (const std::string quantized = models::QuantizedRefusal(config); !quantized.empty()) {
      errors_->Add(key, absl::StrCat(config_path, ": ", SanitizeForDisplay(quantized, 200)));
    }
  }

  // A data file: present, and its first rows make prompts the reward rule can score
  // (CheckDataHead). Every row is read when the job starts.
  void DataFile(const std::string& key, std::string* path, const v1::DataSpec& data,
                const std::string& reward_rule, RowKind kind = RowKind::kPrompt) {
    if (!Resolve(key, path)) return;
    if (absl::Status read = CheckDataHead(*path, data, reward_rule, kind); !read.ok()) {
      errors_->Add(key, std::string(read.message()));
    }
  }

  // Tensor parallelism splits heads, key/value heads, the MLP and the vocabulary `tp` ways.
  void SplitsInto(const std::string& key, int tp, const std::string& model_dir) {
    if (tp <= 1 || model_dir.empty()) return;
    auto text = ReadFilePrefix(model_dir + "/config.json", 1 << 20);
    if (!text.ok()) return;  // ModelDirectory named what is missing
    const nlohmann::json config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!config.is_object()) return;
    const auto number = [&](const char* name, const char* fallback) -> int64_t {
      for (const char* field : {name, fallback}) {
        if (field != nullptr && config.contains(field) && config[field].is_number_integer()) {
          return config[field].get<int64_t>();
        }
      }
      return 0;
    };
    for (const auto& [field, value] :
         {std::pair{"num_attention_heads", number("num_attention_heads", nullptr)},
          std::pair{"num_key_value_heads", number("num_key_value_heads", "num_attention_heads")},
          std::pair{"intermediate_size", number("intermediate_size", nullptr)},
          std::pair{"vocab_size", number("vocab_size", nullptr)}}) {
      if (value > 0 && value % tp != 0) {
        errors_->Add(key, absl::StrCat(tp, " does not divide the model's ", field, " (", value,
                                       ", ", model_dir, "/config.json); choose a tp that does"));
      }
    }
  }

  // A Python reward function's file (workers read it; a shared path, as model directories are):
  // present, and naming the function somewhere. pkg:// modules are looked up by the workers.
  void RewardFunction(const std::string& key, v1::PythonRewardSpec* function) {
    std::string* path = function->mutable_path();
    if (path->empty() || absl::StartsWith(*path, "pkg://")) return;
    if (absl::StartsWith(*path, "file://")) path->erase(0, 7);
    if (!Resolve(key + ".path", path)) return;
    auto text = ReadFilePrefix(*path, 16 << 20);
    if (!text.ok()) {
      errors_->Add(key + ".path", absl::StrCat("cannot read the reward function's file: ",
                                               text.status().message()));
      return;
    }
    // The name as a word: a def, an assignment or an import all name it.
    const std::string& name = function->name().empty() ? "compute_score" : function->name();
    bool named = false;
    for (size_t at = text->find(name); at != std::string::npos && !named;
         at = text->find(name, at + 1)) {
      const auto word = [](char c) { return absl::ascii_isalnum(c) || c == '_'; };
      named = (at == 0 || !word((*text)[at - 1])) &&
              (at + name.size() == text->size() || !word((*text)[at + name.size()]));
    }
    if (!named) {
      errors_->Add(key + ".name", absl::StrCat("'", name, "' is not defined in ", *path,
                                               " (verl's default name is compute_score)"));
    }
  }

  void Directory(const std::string& key, std::string* path) {
    if (!path->empty()) Resolve(key, path);
  }

  // A file the workers read (a shared path, as model directories are): present. `what` names it.
  void File(const std::string& key, std::string* path, absl::string_view what) {
    if (path->empty() || !Resolve(key, path)) return;
    if (!PathExists(*path) || IsDirectory(*path)) {
      errors_->Add(key, absl::StrCat(what, " '", *path, "' not found"));
    }
  }

  // A PEFT adapter directory (the workers check its tensors when the job starts).
  void AdapterDirectory(const std::string& key, std::string* path) {
    if (path->empty() || !Resolve(key, path)) return;
    if (!PathExists(*path + "/adapter_config.json")) {
      errors_->Add(key, absl::StrCat("'", *path,
                                     "' is not a PEFT adapter directory: no "
                                     "adapter_config.json (PeftModel.save_pretrained writes one)"));
    }
  }

 private:
  const std::string& base_dir_;
  config::ConfigErrors* errors_;
};

}  // namespace

void ResolveAndCheckFiles(const std::string& base_dir, v1::JobSpec* spec,
                          config::ConfigErrors* problems) {
  config::ConfigErrors errors(problems->source());
  // A path the config check refused already is not checked again.
  errors.SuppressConsequencesOf(*problems);
  if (!base_dir.empty() && (base_dir[0] != '/' || base_dir.size() > 4096)) {
    errors.Add("", "base_dir must be an absolute directory");
    problems->Append(errors);
    return;
  }
  FileChecker check(base_dir, &errors);
  auto* model = spec->mutable_model();
  check.ModelDirectory("model.path", model->mutable_path(), model->tokenizer_path().empty());
  if (!model->tokenizer_path().empty() &&
      check.Resolve("model.tokenizer_path", model->mutable_tokenizer_path())) {
    if (!PathExists(model->tokenizer_path() + "/tokenizer.json")) {
      errors.Add("model.tokenizer_path",
                 absl::StrCat("no tokenizer.json in '", model->tokenizer_path(), "'"));
    }
  }
  check.AdapterDirectory("model.lora_adapter_path", model->mutable_lora_adapter_path());
  auto* data = spec->mutable_data();
  const RowKind training_rows = TrainingRows(*spec);
  for (int i = 0; i < data->train_files_size(); ++i) {
    check.DataFile(absl::StrCat("data.train_files[", i, "]"), data->mutable_train_files(i), *data,
                   ScoringRule(*spec, training_rows), training_rows);
  }
  const RowKind validation_rows = ValidationRows(*spec);
  for (int i = 0; i < data->val_files_size(); ++i) {
    check.DataFile(absl::StrCat("data.val_files[", i, "]"), data->mutable_val_files(i), *data,
                   ScoringRule(*spec, validation_rows), validation_rows);
  }
  auto* roles = spec->mutable_roles();
  if (roles->has_critic() && !roles->critic().model_path().empty()) {
    check.ModelDirectory("roles.critic.model_path", roles->mutable_critic()->mutable_model_path(),
                         /*needs_tokenizer=*/false);
  }
  if (!roles->reward().model().empty()) {
    check.ModelDirectory("roles.reward.model", roles->mutable_reward()->mutable_model(),
                         /*needs_tokenizer=*/false);
  }
  if (roles->reward().has_custom_reward_function()) {
    check.RewardFunction("roles.reward.custom_reward_function",
                         roles->mutable_reward()->mutable_custom_reward_function());
  }
  check.File(
      "roles.actor.rollout.multi_turn.tool_config_path",
      roles->mutable_actor()->mutable_rollout()->mutable_multi_turn()->mutable_tool_config_path(),
      "the tool config");
  check.SplitsInto("roles.actor.rollout.tp", roles->actor().rollout().tp(), model->path());
  check.Directory("trainer.checkpoint_dir", spec->mutable_trainer()->mutable_checkpoint_dir());
  problems->Append(errors);
}

std::string SlowRolloutWarning(const v1::JobSpec& spec) {
  const int tp = spec.roles().actor().rollout().tp();
  if (tp <= 1 || spec.trainer().device() == "cpu" || spec.model().path().empty()) return "";
  auto text = ReadFilePrefix(spec.model().path() + "/config.json", 1 << 20);
  if (!text.ok()) return "";
  const nlohmann::json config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return "";
  int64_t head_dim = 0;
  if (config.contains("head_dim") && config["head_dim"].is_number_integer()) {
    head_dim = config["head_dim"].get<int64_t>();
  } else if (config.contains("hidden_size") && config["hidden_size"].is_number_integer() &&
             config.contains("num_attention_heads") &&
             config["num_attention_heads"].is_number_integer() &&
             config["num_attention_heads"].get<int64_t>() > 0) {
    head_dim = config["hidden_size"].get<int64_t>() / config["num_attention_heads"].get<int64_t>();
  }
  if (head_dim == 0 || head_dim == 64 || head_dim == 128) return "";
  return absl::StrCat("roles.actor.rollout.tp ", tp, " on GPU workers: the model's head dim is ",
                      head_dim,
                      ", which the fused decode does not serve (64, 128), so the rollout "
                      "recomputes each sample's whole prefix per token; tp 1 keeps a KV cache");
}

}  // namespace rlhfd::controller
