// libFuzzer target: any bytes as one of a model directory's JSON files — config.json,
// generation_config.json or tokenizer_config.json (the first byte picks which). Each must parse
// or be refused with a Status, never throw or crash, and what parses must be within bounds.
#include <cstddef>
#include <cstdint>

#include "worker/model/model_config.h"
#include "worker/model/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: {
      auto config = rlhfd::model::ParseModelConfig(text, "config.json");
      if (config.ok() && (config->vocab_size < 1 || config->head_dim < 2 ||
                          config->num_heads % config->num_kv_heads != 0)) {
        __builtin_trap();
      }
      break;
    }
    case 1: {
      rlhfd::model::ModelConfig config;
      (void)rlhfd::model::ApplyGenerationConfig(text, "generation_config.json", &config);
      break;
    }
    default:
      (void)rlhfd::model::ParseTokenizerConfig(text, "tokenizer_config.json");
      break;
  }
  return 0;
}
