// config.json parsing; see model_config.h.
#include "worker/model/model_config.h"

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"

namespace rlhfd::model {
namespace {

absl::Status Invalid(absl::string_view source, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
}

// An integer key that must be present and positive.
absl::Status ReadPositive(const nlohmann::json& config, const char* key, absl::string_view source,
                          int64_t* out) {
  if (!config.contains(key) || !config[key].is_number_integer() || config[key].get<int64_t>() <= 0) {
    return Invalid(source, absl::StrCat("'", key, "' must be a positive integer"));
  }
  *out = config[key].get<int64_t>();
  return absl::OkStatus();
}

// Token ids: an integer, a list of integers, or null.
std::vector<int64_t> ReadIds(const nlohmann::json& value) {
  std::vector<int64_t> ids;
  if (value.is_number_integer()) ids.push_back(value.get<int64_t>());
  if (value.is_array()) {
    for (const auto& id : value) {
      if (id.is_number_integer()) ids.push_back(id.get<int64_t>());
    }
  }
  return ids;
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json, absl::string_view source) {
  const nlohmann::json config = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) return Invalid(source, "not a JSON object");
  ModelConfig out;
  if (!config.contains("architectures") || !config["architectures"].is_array() ||
      config["architectures"].size() != 1 || !config["architectures"][0].is_string()) {
    return Invalid(source, "'architectures' must list exactly one architecture");
  }
  out.architecture = config["architectures"][0].get<std::string>();
  const std::string& arch = out.architecture;
  struct Family {
    const char* prefix;
    ModelFamily family;
  };
  const Family families[] = {{"Llama", ModelFamily::kLlama},
                             {"Mistral", ModelFamily::kMistral},
                             {"Qwen2", ModelFamily::kQwen2},
                             {"Qwen3", ModelFamily::kQwen3}};
  bool known = false;
  for (const Family& family : families) {
    for (const auto& [suffix, head] :
         {std::pair{"ForCausalLM", HeadKind::kCausalLm},
          std::pair{"ForSequenceClassification", HeadKind::kSequenceScore},
          std::pair{"ForTokenClassification", HeadKind::kTokenScore}}) {
      if (arch == absl::StrCat(family.prefix, suffix)) {
        out.family = family.family;
        out.head = head;
        known = true;
      }
    }
  }
  if (!known) {
    return Invalid(source, absl::StrCat("architecture '", arch,
                                        "' is not supported; supported: Llama, Mistral, Qwen2, "
                                        "Qwen3 with ForCausalLM, ForSequenceClassification or "
                                        "ForTokenClassification"));
  }
  if (config.contains("num_experts") || config.contains("num_local_experts")) {
    return Invalid(source, "mixture-of-experts models are not supported");
  }
  const std::string act = config.value("hidden_act", std::string("silu"));
  if (act != "silu") {
    return Invalid(source, absl::StrCat("hidden_act '", act, "' is not supported (only silu)"));
  }
  const bool sliding = config.value("use_sliding_window", false) ||
                       (out.family == ModelFamily::kMistral && config.contains("sliding_window") &&
                        !config["sliding_window"].is_null());
  if (sliding) {
    return Invalid(source, "sliding-window attention is not supported; set sliding_window: null "
                           "only if the model was trained without it");
  }
  RETURN_IF_ERROR(ReadPositive(config, "vocab_size", source, &out.vocab_size));
  RETURN_IF_ERROR(ReadPositive(config, "hidden_size", source, &out.hidden_size));
  RETURN_IF_ERROR(ReadPositive(config, "intermediate_size", source, &out.intermediate_size));
  RETURN_IF_ERROR(ReadPositive(config, "num_hidden_layers", source, &out.num_layers));
  RETURN_IF_ERROR(ReadPositive(config, "num_attention_heads", source, &out.num_heads));
  out.num_kv_heads = out.num_heads;
  if (config.contains("num_key_value_heads") && !config["num_key_value_heads"].is_null()) {
    RETURN_IF_ERROR(ReadPositive(config, "num_key_value_heads", source, &out.num_kv_heads));
  }
  if (out.num_heads % out.num_kv_heads != 0) {
    return Invalid(source, absl::StrCat("num_attention_heads (", out.num_heads,
                                        ") must be a multiple of num_key_value_heads (",
                                        out.num_kv_heads, ")"));
  }
  out.head_dim = out.hidden_size / out.num_heads;
  if (config.contains("head_dim") && !config["head_dim"].is_null()) {
    RETURN_IF_ERROR(ReadPositive(config, "head_dim", source, &out.head_dim));
  }
  if (out.head_dim % 2 != 0) return Invalid(source, "head_dim must be even for RoPE");
  out.max_position_embeddings = config.value("max_position_embeddings", int64_t{4096});
  out.rms_norm_eps = config.value("rms_norm_eps", 1e-6);
  out.tie_word_embeddings = config.value("tie_word_embeddings", false);

  // RoPE: transformers 5 writes rope_parameters; older files rope_theta + rope_scaling.
  nlohmann::json rope = config.contains("rope_parameters") && config["rope_parameters"].is_object()
                            ? config["rope_parameters"]
                            : nlohmann::json::object();
  if (config.contains("rope_scaling") && config["rope_scaling"].is_object()) {
    rope.update(config["rope_scaling"]);
  }
  out.rope.theta = rope.value("rope_theta", config.value("rope_theta", 10000.0));
  out.rope.type = rope.value("rope_type", rope.value("type", std::string("default")));
  if (out.rope.type == "llama3") {
    out.rope.factor = rope.value("factor", 8.0);
    out.rope.low_freq_factor = rope.value("low_freq_factor", 1.0);
    out.rope.high_freq_factor = rope.value("high_freq_factor", 4.0);
    out.rope.original_max_position_embeddings =
        rope.value("original_max_position_embeddings", int64_t{8192});
  } else if (out.rope.type != "default") {
    return Invalid(source, absl::StrCat("rope type '", out.rope.type,
                                        "' is not supported (default, llama3)"));
  }

  switch (out.family) {
    case ModelFamily::kQwen2:
      out.attention_bias = true;
      break;
    case ModelFamily::kQwen3:
      out.qk_norm = true;
      out.attention_bias = config.value("attention_bias", false);
      out.output_bias = out.attention_bias;
      break;
    case ModelFamily::kLlama:
    case ModelFamily::kMistral:
      out.attention_bias = config.value("attention_bias", false);
      out.output_bias = out.attention_bias;
      out.mlp_bias = config.value("mlp_bias", false);
      break;
  }
  if (out.head != HeadKind::kCausalLm) {
    if (config.contains("num_labels")) {
      out.num_labels = config["num_labels"].get<int64_t>();
    } else if (config.contains("id2label") && config["id2label"].is_object()) {
      out.num_labels = static_cast<int64_t>(config["id2label"].size());
    }
    if (out.num_labels < 1) return Invalid(source, "num_labels must be >= 1");
    out.score_bias = out.head == HeadKind::kTokenScore;
  }
  if (config.contains("pad_token_id") && config["pad_token_id"].is_number_integer()) {
    out.pad_token_id = config["pad_token_id"].get<int64_t>();
  }
  if (config.contains("bos_token_id") && config["bos_token_id"].is_number_integer()) {
    out.bos_token_id = config["bos_token_id"].get<int64_t>();
  }
  if (config.contains("eos_token_id")) out.eos_token_ids = ReadIds(config["eos_token_id"]);
  return out;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 1 << 20));
  ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(text, path));
  // generation_config.json, when present, is what generation uses for EOS and padding.
  auto generation = ReadFileToString(dir + "/generation_config.json", 1 << 20);
  if (generation.ok()) {
    const nlohmann::json json = nlohmann::json::parse(*generation, nullptr, false);
    if (json.is_object()) {
      if (json.contains("eos_token_id")) {
        std::vector<int64_t> ids = ReadIds(json["eos_token_id"]);
        if (!ids.empty()) config.eos_token_ids = ids;
      }
      if (json.contains("pad_token_id") && json["pad_token_id"].is_number_integer()) {
        config.pad_token_id = json["pad_token_id"].get<int64_t>();
      }
    }
  }
  return config;
}

}  // namespace rlhfd::model
