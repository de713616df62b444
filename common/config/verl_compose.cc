#include "common/config/verl_compose.h"

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/config/config_document.h"
#include "common/config/hydra_compose.h"
#include "common/config/overrides.h"
#include "common/config/verl_defaults.h"
#include "common/config/verl_interpolation.h"
#include "common/status/status_macros.h"

namespace rlhfd::config {

using Json = nlohmann::json;

namespace {

// A file's Hydra `defaults` list may name only what rlhfd composes under it: verl's own trainer
// config, _self_, and the choices of its parts verl's own list makes (`model_engine: dp`,
// `actor@actor_rollout_ref.actor: dp_actor`...). A config of the user's, or Megatron's parts,
// would be left out without a word.
absl::Status CheckDefaultsList(const Json& file, absl::string_view source, VerlTrainer trainer) {
  const auto list = file.find("defaults");
  if (list == file.end()) return absl::OkStatus();
  const std::vector<std::string> own =
      trainer == VerlTrainer::kSft
          ? std::vector<std::string>{"sft_trainer_engine", "sft_trainer", "_self_"}
          : std::vector<std::string>{"ppo_trainer", "_self_"};
  if (!list->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": defaults must be a list such as [", own[0], ", _self_]"));
  }
  for (const Json& entry : *list) {
    const std::string text = entry.is_string() ? entry.get<std::string>() : entry.dump();
    const bool megatron = absl::StrContains(absl::AsciiStrToLower(text), "megatron");
    const bool part_choice = entry.is_object() && entry.size() == 1 &&
                             !absl::StartsWith(entry.begin().key(), "override ");
    if (!megatron && ((entry.is_string() && absl::c_linear_search(own, text)) || part_choice)) {
      continue;
    }
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": defaults: '", text.substr(0, 80), "' composes ",
                     megatron ? "Megatron's parts, which rlhfd does not run"
                              : "another config, which rlhfd does not read",
                     ": rlhfd composes verl's ", own[0],
                     " and this file (_self_); write that config's keys "
                     "into this file"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ComposedVerlRun> ComposeVerlRun(VerlTrainer trainer, absl::string_view text,
                                               absl::string_view source,
                                               const std::vector<std::string>& overrides) {
  ASSIGN_OR_RETURN(Json defaults,
                   ParseConfigDocument(VerlTrainerYaml(trainer), trainer == VerlTrainer::kSft
                                                                     ? "verl_sft_trainer.yaml"
                                                                     : "verl_ppo_trainer.yaml"));
  hydra::TypeAll(&defaults);
  ComposedVerlRun run{.document = defaults};
  if (!text.empty()) {
    ASSIGN_OR_RETURN(Json file, ParseConfigDocument(text, source));
    if (!file.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": a verl config is a mapping"));
    }
    RETURN_IF_ERROR(CheckDefaultsList(file, source, trainer));
    hydra::TypeAll(&file);
    std::map<std::string, Json> leaves;
    hydra::Flatten(file, "", &leaves);
    for (const auto& [key, value] : leaves) run.written.insert(key);
    hydra::MergeInto(&run.document, file);
  }
  if (absl::Status applied = ApplyOverrides(overrides, &run.document); !applied.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", applied.message()));
  }
  for (const std::string& item : overrides) {
    // Hydra's forms: key=value, +key=value, ++key=value, ~key.
    const std::string key = item.substr(0, item.find('='));
    if (const size_t start = key.find_first_not_of("+~"); start != std::string::npos) {
      run.written.insert(key.substr(start));
    }
  }
  hydra::TypeAll(&run.document);
  std::map<std::string, Json> verl_defaults, given;
  hydra::Flatten(defaults, "", &verl_defaults);
  hydra::Flatten(run.document, "", &given);
  for (const auto& [key, value] : given) {
    auto fallback = verl_defaults.find(key);
    if (fallback == verl_defaults.end() || fallback->second != value) run.user_set.insert(key);
  }
  for (const auto& [key, value] : verl_defaults) run.verl_keys.insert(key);
  run.unresolved = ResolveInterpolations(&run.document);
  hydra::Flatten(run.document, "", &run.flat);
  return run;
}

}  // namespace rlhfd::config
