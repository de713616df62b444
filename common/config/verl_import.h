// Reading a verl trainer config (its ppo_trainer.yaml layout: data, actor_rollout_ref.{model,
// actor, rollout, ref}, critic, reward_model, algorithm, trainer) with Hydra-style overrides as
// verl's run scripts pass them, and writing the rlhfd config it means. Every key rlhfd supports
// is mapped (docs/coming-from-verl.md has the table); every other key is named in the report —
// a warning where ignoring it changes nothing about training (rollout.name=vllm, a profiler),
// an error where it would (LoRA, Megatron, a custom reward function).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rlhfd::config {

struct VerlConversion {
  nlohmann::json config;              // an rlhfd config document (not yet validated)
  std::vector<std::string> mapped;    // "verl.key -> rlhfd.key"
  std::vector<std::string> warnings;  // "verl.key: ignored (why)"
  std::vector<std::string> errors;    // "verl.key: not supported (why)"
};

// `text` may be empty (overrides alone, on verl's defaults). INVALID_ARGUMENT only when the
// text or an override cannot be read; unsupported keys go to `errors`.
absl::StatusOr<VerlConversion> ConvertVerlConfig(absl::string_view text, absl::string_view source,
                                                 const std::vector<std::string>& overrides);

// The verl keys ConvertVerlConfig maps directly and where each lands (for docs and tests).
const std::vector<std::pair<std::string, std::string>>& VerlDirectMappings();

}  // namespace rlhfd::config
