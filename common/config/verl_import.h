// Reading a verl trainer config (its ppo_trainer.yaml layout: data, actor_rollout_ref.{model,
// actor, rollout, ref}, critic, reward_model, algorithm, trainer; or its SFT trainer's: data,
// model, engine, optim, trainer) with Hydra-style overrides as verl's run scripts pass them, and
// writing the rlhfd config it means (an SFT config: a job with trainer.mode sft). Every key rlhfd
// supports is mapped (docs/coming-from-verl.md has the table); every other key is named in the
// report — a warning where ignoring it changes nothing about training (rollout.name=vllm, a
// profiler), an error where it would (LoRA, Megatron, a custom reward function).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/config/verl_defaults.h"

namespace rlhfd::config {

// A verl key the conversion does not honour, and why.
struct VerlNote {
  std::string key;
  std::string why;
  bool refused = false;  // true: training would change (an error); false: it would not
};

struct VerlConversion {
  nlohmann::json config;              // an rlhfd config document (not yet validated)
  std::vector<std::string> mapped;    // "verl.key -> rlhfd.key"
  std::vector<std::string> warnings;  // "verl.key: ignored (why)"
  std::vector<std::string> errors;    // "verl.key: not supported (why)"
  std::vector<VerlNote> notes;        // the warnings and errors, once per key
  std::vector<std::string> read;      // every verl key the converter's code read (for tests)
  nlohmann::json verl_resolved;       // the verl config as composed and resolved, before mapping
};

// The notes grouped by reason, errors first: "error: not supported (why): key, key" lines.
std::string FormatVerlNotes(const VerlConversion& conversion);

// The config is composed as verl's Hydra composes it: `trainer`'s own defaults
// (verl_defaults.h), `text` over them, then the overrides; `${...}` interpolations are resolved
// as OmegaConf resolves them, and one that cannot be is refused naming its key. `text` may be
// empty (overrides alone). An SFT config may use the keys of verl's SFT trainer before 0.9
// (fsdp_sft_trainer: model.partial_pretrain, data.multiturn.*, single-turn prompt/response
// keys), each read as verl 0.9.1's and listed. INVALID_ARGUMENT only when the text or an
// override cannot be read; unsupported keys go to `errors`.
absl::StatusOr<VerlConversion> ConvertVerlConfig(absl::string_view text, absl::string_view source,
                                                 const std::vector<std::string>& overrides,
                                                 VerlTrainer trainer = VerlTrainer::kPpo);

// The verl keys ConvertVerlConfig maps directly and where each lands (for docs and tests).
const std::vector<std::pair<std::string, std::string>>& VerlDirectMappings();

}  // namespace rlhfd::config
