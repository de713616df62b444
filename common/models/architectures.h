// The model architectures rlhfd runs, in one table: a Hugging Face `architectures` name is a
// family prefix (the decoder) and a head suffix. The worker's loader builds the decoder from it;
// submission refuses an unsupported model (config.json) before anything is queued.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace rlhfd::models {

enum class Family { kLlama, kMistral, kQwen2, kQwen3 };
// Which head sits on the decoder: next-token logits, or a scalar per token (critics, reward
// models: *ForSequenceClassification pools the last token, *ForTokenClassification does not).
enum class Head { kCausalLm, kSequenceScore, kTokenScore };

inline constexpr struct {
  std::string_view prefix;
  Family family;
} kFamilies[] = {{"Llama", Family::kLlama},
                 {"Mistral", Family::kMistral},
                 {"Qwen2", Family::kQwen2},
                 {"Qwen3", Family::kQwen3}};

inline constexpr struct {
  std::string_view suffix;
  Head head;
} kHeads[] = {{"ForCausalLM", Head::kCausalLm},
              {"ForSequenceClassification", Head::kSequenceScore},
              {"ForTokenClassification", Head::kTokenScore}};

struct Architecture {
  Family family;
  Head head;
};

// The family and head of `name` ("Qwen2ForCausalLM"); nullopt when the table has none.
std::optional<Architecture> FindArchitecture(std::string_view name);
// "Llama, Mistral, Qwen2, Qwen3 with ForCausalLM, ForSequenceClassification or
// ForTokenClassification", for errors.
std::string SupportedArchitectures();

// Why a config.json's checkpoint cannot be loaded for its quantization (AWQ, GPTQ, FP8: packed
// weights and scales, not the weights), or "" when it names none.
std::string QuantizedRefusal(const nlohmann::json& config);

}  // namespace rlhfd::models
