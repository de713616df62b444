// config.json parsing; see model_config.h.
#include "worker/model/model_config.h"

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"
#include "common/util/text.h"
#include "worker/model/json_fields.h"

namespace rlhfd::model {
namespace {

absl::Status Invalid(absl::string_view source, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
}

// Bounds far past any released model, so that a typo'd or hostile config.json cannot make the
// module's constructor ask for terabytes.
constexpr int64_t kMaxVocabulary = 1 << 24;
constexpr int64_t kMaxHidden = 1 << 16;
constexpr int64_t kMaxIntermediate = 1 << 20;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeads = 1024;
constexpr int64_t kMaxPositions = 1 << 24;

// A size that must be present and positive.
absl::Status ReadPositive(const JsonFields& fields, const char* key, int64_t high,
                          absl::string_view source, int64_t* out) {
  if (!fields.Has(key)) return Invalid(source, absl::StrCat("'", key, "' is required"));
  return fields.Int(key, 0, 1, high, out);
}

// Token ids: an integer, a list of integers, or null; other entries are errors.
absl::StatusOr<std::vector<int64_t>> ReadIds(const nlohmann::json& value, absl::string_view source,
                                             absl::string_view key) {
  std::vector<int64_t> ids;
  const auto add = [&](const nlohmann::json& id) -> absl::Status {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMaxVocabulary) {
      return Invalid(source, absl::StrCat("'", key, "' must be token ids (0..", kMaxVocabulary,
                                          ")"));
    }
    ids.push_back(id.get<int64_t>());
    return absl::OkStatus();
  };
  if (value.is_null()) return ids;
  if (value.is_array()) {
    for (const auto& id : value) RETURN_IF_ERROR(add(id));
  } else {
    RETURN_IF_ERROR(add(value));
  }
  return ids;
}

absl::StatusOr<ModelConfig> Parse(const nlohmann::json& config, absl::string_view source) {
  if (!config.is_object()) return Invalid(source, "not a JSON object");
  const JsonFields fields(config, source);
  ModelConfig out;
  if (!config.contains("architectures") || !config["architectures"].is_array() ||
      config["architectures"].size() != 1 || !config["architectures"][0].is_string()) {
    return Invalid(source, "'architectures' must list exactly one architecture");
  }
  out.architecture = config["architectures"][0].get<std::string>();
  const std::optional<models::Architecture> known = models::FindArchitecture(out.architecture);
  if (!known) {
    return Invalid(
        source, absl::StrCat("architecture '", SanitizeForDisplay(out.architecture, 80),
                             "' is not supported; supported: ", models::SupportedArchitectures()));
  }
  out.family = known->family;
  out.head = known->head;
  if (config.contains("num_experts") || config.contains("num_local_experts")) {
    return Invalid(source, "mixture-of-experts models are not supported");
  }
  if (const std::string quantized = models::QuantizedRefusal(config); !quantized.empty()) {
    return Invalid(source, SanitizeForDisplay(quantized, 200));
  }
  std::string act;
  RETURN_IF_ERROR(fields.String("hidden_act", "silu", &act));
  if (act != "silu") {
    return Invalid(source, absl::StrCat("hidden_act '", SanitizeForDisplay(act, 40),
                                        "' is not supported (only silu)"));
  }
  // Mistral slides unless sliding_window is null (absent: transformers' MistralConfig default,
  // 4096); Qwen2 / Qwen3 only with use_sliding_window.
  bool use_sliding = out.family == ModelFamily::kMistral &&
                     (!config.contains("sliding_window") || fields.Has("sliding_window"));
  if (out.family == ModelFamily::kQwen2 || out.family == ModelFamily::kQwen3) {
    RETURN_IF_ERROR(fields.Bool("use_sliding_window", false, &use_sliding));
  }
  if (use_sliding) {
    RETURN_IF_ERROR(fields.Int("sliding_window", 4096, 1, kMaxPositions, &out.sliding_window));
  }
  RETURN_IF_ERROR(ReadPositive(fields, "vocab_size", kMaxVocabulary, source, &out.vocab_size));
  RETURN_IF_ERROR(ReadPositive(fields, "hidden_size", kMaxHidden, source, &out.hidden_size));
  RETURN_IF_ERROR(
      ReadPositive(fields, "intermediate_size", kMaxIntermediate, source, &out.intermediate_size));
  RETURN_IF_ERROR(ReadPositive(fields, "num_hidden_layers", kMaxLayers, source, &out.num_layers));
  RETURN_IF_ERROR(ReadPositive(fields, "num_attention_heads", kMaxHeads, source, &out.num_heads));
  RETURN_IF_ERROR(
      fields.Int("num_key_value_heads", out.num_heads, 1, kMaxHeads, &out.num_kv_heads));
  if (out.num_heads % out.num_kv_heads != 0) {
    return Invalid(source, absl::StrCat("num_attention_heads (", out.num_heads,
                                        ") must be a multiple of num_key_value_heads (",
                                        out.num_kv_heads, ")"));
  }
  // Absent: hidden_size / heads, but Qwen3Config's own default is 128 (its configs say so).
  RETURN_IF_ERROR(fields.Int(
      "head_dim", out.family == ModelFamily::kQwen3 ? 128 : out.hidden_size / out.num_heads, 0,
      4096, &out.head_dim));
  if (out.head_dim < 2 || out.head_dim % 2 != 0) {
    return Invalid(source, absl::StrCat("head_dim ", out.head_dim, " must be even and >= 2 for RoPE"));
  }
  RETURN_IF_ERROR(fields.Int("max_position_embeddings", 4096, 1, kMaxPositions,
                             &out.max_position_embeddings));
  RETURN_IF_ERROR(fields.Number("rms_norm_eps", 1e-6, 1e-30, 1.0, &out.rms_norm_eps));
  RETURN_IF_ERROR(fields.Bool("tie_word_embeddings", false, &out.tie_word_embeddings));
  RETURN_IF_ERROR(fields.Number("initializer_range", 0.02, 0, 10, &out.initializer_range));

  // RoPE: transformers 5 writes rope_parameters; older files rope_theta + rope_scaling.
  nlohmann::json rope = config.contains("rope_parameters") && config["rope_parameters"].is_object()
                            ? config["rope_parameters"]
                            : nlohmann::json::object();
  if (config.contains("rope_scaling") && config["rope_scaling"].is_object()) {
    rope.update(config["rope_scaling"]);
  }
  const JsonFields rope_fields(rope, source);
  double theta = 10000.0;
  RETURN_IF_ERROR(fields.Number("rope_theta", 10000.0, 1e-6, 1e15, &theta));
  RETURN_IF_ERROR(rope_fields.Number("rope_theta", theta, 1e-6, 1e15, &out.rope.theta));
  std::string type;
  RETURN_IF_ERROR(rope_fields.String("type", "default", &type));
  RETURN_IF_ERROR(rope_fields.String("rope_type", type, &out.rope.type));
  if (out.rope.type == "llama3") {
    RETURN_IF_ERROR(rope_fields.Number("factor", 8.0, 1e-6, 1e6, &out.rope.factor));
    RETURN_IF_ERROR(
        rope_fields.Number("low_freq_factor", 1.0, 1e-6, 1e6, &out.rope.low_freq_factor));
    RETURN_IF_ERROR(
        rope_fields.Number("high_freq_factor", 4.0, 1e-6, 1e6, &out.rope.high_freq_factor));
    RETURN_IF_ERROR(rope_fields.Int("original_max_position_embeddings", 8192, 1, kMaxPositions,
                                    &out.rope.original_max_position_embeddings));
  } else if (out.rope.type != "default") {
    return Invalid(source, absl::StrCat("rope type '", SanitizeForDisplay(out.rope.type, 40),
                                        "' is not supported (default, llama3)"));
  }

  switch (out.family) {
    case ModelFamily::kQwen2:
      out.attention_bias = true;
      break;
    case ModelFamily::kQwen3:
      out.qk_norm = true;
      RETURN_IF_ERROR(fields.Bool("attention_bias", false, &out.attention_bias));
      out.output_bias = out.attention_bias;
      break;
    case ModelFamily::kLlama:
    case ModelFamily::kMistral:
      RETURN_IF_ERROR(fields.Bool("attention_bias", false, &out.attention_bias));
      out.output_bias = out.attention_bias;
      RETURN_IF_ERROR(fields.Bool("mlp_bias", false, &out.mlp_bias));
      break;
  }
  if (out.head != HeadKind::kCausalLm) {
    int64_t labels = 1;
    if (config.contains("id2label") && config["id2label"].is_object()) {
      labels = static_cast<int64_t>(config["id2label"].size());
    }
    RETURN_IF_ERROR(fields.Int("num_labels", labels, 1, 1 << 16, &out.num_labels));
    out.score_bias = out.head == HeadKind::kTokenScore;
  }
  RETURN_IF_ERROR(fields.Int("pad_token_id", -1, -1, kMaxVocabulary, &out.pad_token_id));
  RETURN_IF_ERROR(fields.Int("bos_token_id", -1, -1, kMaxVocabulary, &out.bos_token_id));
  if (config.contains("eos_token_id")) {
    ASSIGN_OR_RETURN(out.eos_token_ids, ReadIds(config["eos_token_id"], source, "eos_token_id"));
  }
  return out;
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json, absl::string_view source) {
  ASSIGN_OR_RETURN(const nlohmann::json config, ParseModelJson(json, source));
  try {
    return Parse(config, source);
  } catch (const std::exception& error) {
    // Every read above is typed; this is the boundary that keeps it so.
    return Invalid(source, absl::StrCat("cannot be read (", SanitizeForDisplay(error.what(), 200), ")"));
  }
}

absl::Status CheckSequenceFits(const ModelConfig& config, int64_t tokens, absl::string_view what) {
  if (config.sliding_window == 0 || tokens <= config.sliding_window) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the model uses sliding-window attention with a window of ", config.sliding_window,
      " tokens, which rlhfd does not implement; ", what, " reach ", tokens,
      " tokens. Keep sequences within the window (they then attend exactly as in full "
      "attention)"));
}

absl::Status ApplyGenerationConfig(absl::string_view text, absl::string_view source,
                                   ModelConfig* config) {
  ASSIGN_OR_RETURN(const nlohmann::json json, ParseModelJson(text, source));
  if (!json.is_object()) return Invalid(source, "not a JSON object");
  try {
    if (json.contains("eos_token_id")) {
      ASSIGN_OR_RETURN(std::vector<int64_t> ids, ReadIds(json["eos_token_id"], source, "eos_token_id"));
      if (!ids.empty()) config->eos_token_ids = ids;
    }
    return JsonFields(json, source)
        .Int("pad_token_id", config->pad_token_id, -1, kMaxVocabulary, &config->pad_token_id);
  } catch (const std::exception& error) {
    return Invalid(source, absl::StrCat("cannot be read (", SanitizeForDisplay(error.what(), 200), ")"));
  }
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 1 << 20));
  ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(text, path));
  // generation_config.json, when present, is what generation uses for EOS and padding.
  const std::string generation_path = dir + "/generation_config.json";
  auto generation = ReadFileToString(generation_path, 1 << 20);
  if (generation.ok()) {
    RETURN_IF_ERROR(ApplyGenerationConfig(*generation, generation_path, &config));
  } else if (!absl::IsNotFound(generation.status())) {
    return generation.status();
  }
  return config;
}

}  // namespace rlhfd::model
