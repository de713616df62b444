// ModelConfig: what rlhfd needs from a Hugging Face config.json of the Llama / Mistral / Qwen2 /
// Qwen3 family, with unsupported architectures and options refused by name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/models/architectures.h"

namespace rlhfd::model {

// The families and heads of the architecture table (common/models/architectures.h).
using ModelFamily = models::Family;
using HeadKind = models::Head;

struct RopeConfig {
  double theta = 10000.0;
  // "default" or "llama3".
  std::string type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string architecture;  // e.g. "Qwen2ForCausalLM"
  ModelFamily family = ModelFamily::kLlama;
  HeadKind head = HeadKind::kCausalLm;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;  // std of fresh weights (a value head made for a critic)
  bool attention_bias = false;  // Bias on q/k/v (Qwen2 always; Llama when attention_bias).
  bool output_bias = false;     // Bias on o_proj (Llama's attention_bias).
  bool mlp_bias = false;
  bool qk_norm = false;         // Qwen3's RMSNorm on queries and keys per head.
  int64_t num_labels = 1;       // Score heads.
  bool score_bias = false;      // *ForTokenClassification's score has a bias.
  int64_t pad_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;
  // Sliding-window attention's window in tokens; 0 when attention is full. rlhfd computes full
  // attention, which is the same as long as no sequence is longer than the window.
  int64_t sliding_window = 0;
};

// Parses config.json text; `source` names the file in errors, and every wrong type or size
// names its key. Refuses mixture-of-experts, activations other than SiLU and unknown
// architectures or RoPE types.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json, absl::string_view source);

// Whether sequences of `tokens` tokens run exactly with this model: refused (naming the window
// and `what`, e.g. "max_prompt_length + max_response_length") past a sliding window.
absl::Status CheckSequenceFits(const ModelConfig& config, int64_t tokens, absl::string_view what);

// Takes EOS and pad ids from generation_config.json text into `config`.
absl::Status ApplyGenerationConfig(absl::string_view text, absl::string_view source,
                                   ModelConfig* config);

// Reads <dir>/config.json, then EOS/pad ids from <dir>/generation_config.json when present.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

}  // namespace rlhfd::model
