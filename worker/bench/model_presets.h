// Model shapes of the benchmark presets (Qwen2.5 family), random-initialised: benchmarks need
// the shape, not trained weights.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "worker/model/model_config.h"

namespace rlhfd::bench {

// "qwen2.5-0.5b", "qwen2.5-1.5b" or "qwen2.5-7b".
inline absl::StatusOr<model::ModelConfig> PresetConfig(const std::string& name) {
  model::ModelConfig c;
  c.architecture = "Qwen2ForCausalLM";
  c.family = model::ModelFamily::kQwen2;
  c.attention_bias = true;
  c.vocab_size = 151936;
  c.max_position_embeddings = 32768;
  c.rope.theta = 1000000.0;
  if (name == "qwen2.5-0.5b") {
    c.hidden_size = 896, c.intermediate_size = 4864, c.num_layers = 24, c.num_heads = 14;
    c.num_kv_heads = 2, c.tie_word_embeddings = true;
  } else if (name == "qwen2.5-1.5b") {
    c.hidden_size = 1536, c.intermediate_size = 8960, c.num_layers = 28, c.num_heads = 12;
    c.num_kv_heads = 2, c.tie_word_embeddings = true;
  } else if (name == "qwen2.5-7b") {
    c.hidden_size = 3584, c.intermediate_size = 18944, c.num_layers = 28, c.num_heads = 28;
    c.num_kv_heads = 4, c.tie_word_embeddings = false, c.vocab_size = 152064;
  } else {
    return absl::InvalidArgumentError(
        "--preset must be qwen2.5-0.5b, qwen2.5-1.5b or qwen2.5-7b");
  }
  c.head_dim = c.hidden_size / c.num_heads;
  return c;
}

}  // namespace rlhfd::bench
