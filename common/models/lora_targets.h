// The linear layers a LoRA adapter may go on (PEFT's target_modules for the Llama, Mistral and
// Qwen families), in one table: the validator checks a job's model.target_modules against it and
// the worker adds adapters to the layers it names.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace rlhfd::models {

// Each decoder layer's linear layers, by their Hugging Face names, in forward order. The head
// (lm_head) is never adapted, as PEFT's "all-linear" leaves the output layer out.
inline constexpr std::string_view kLoraLayers[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"};

// The layers verl's target_modules names: "all-linear" (alone: every layer above), or names from
// kLoraLayers, returned in that table's order without repeats. INVALID_ARGUMENT naming the first
// entry that is neither, or an empty list.
absl::StatusOr<std::vector<std::string>> ResolveLoraTargets(
    const std::vector<std::string>& target_modules);

}  // namespace rlhfd::models
