// What verl's reward settings become (verl_converter.h): a custom reward function with its
// kwargs, a reward model, the reward managers rlhfd scores as, and verl's default reward (rule
// auto). In verl's older layout (reward_model.*, custom_reward_function.*) and 0.9's reward.*.
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/config/hydra_compose.h"
#include "common/config/verl_converter.h"

namespace rlhfd::config::verl_conversion {

using hydra::Set;

std::string Converter::CustomRewardFunction() {
  std::string found;
  for (const std::string prefix : {"custom_reward_function.", "reward.custom_reward_function."}) {
    const Json* path = Take(prefix + "path");
    const Json* name = Take(prefix + "name");
    std::vector<std::string> kwargs;
    for (const auto& [key, value] : flat_) {
      if (absl::StartsWith(key, prefix + "reward_kwargs")) kwargs.push_back(key);
    }
    if (path == nullptr || !found.empty()) {
      for (const std::string& key : kwargs) Take(key);
      continue;
    }
    found = prefix + "path";
    const std::string to = "roles.reward.custom_reward_function";
    Map(found, to + ".path", Paths(found, *path));
    if (name != nullptr) Map(prefix + "name", to + ".name", *name);
    for (const std::string& key : kwargs) {
      const Json* value = Take(key);
      const std::string argument = key.substr(std::min(key.size(), prefix.size() + 14));
      if (value != nullptr && !argument.empty()) {
        Map(key, absl::StrCat(to, ".reward_kwargs.", argument), *value);
      }
    }
  }
  return found;
}

void Converter::Reward() {
  const std::string custom = CustomRewardFunction();
  const bool enable = Switch("reward_model.enable");
  const Json* path = Take("reward_model.model.path");
  Take("reward_model.model.input_tokenizer");
  // The reward managers that score each row by itself with its function, as rlhfd does (dapo's
  // too, without its overlong penalty); batch calls the function with lists. In verl's older
  // layout and in 0.9's reward section alike.
  for (const char* key : {"reward_model.reward_manager", "reward.reward_manager.name"}) {
    const Json* manager = Take(key);
    const std::string name = manager != nullptr && manager->is_string() ? Text(*manager) : "";
    if (manager != nullptr && name != "naive" && name != "prime" && name != "dapo") {
      Error(key, absl::StrCat("'", Text(*manager),
                              "': rlhfd scores each row by itself with its rule or function, as "
                              "verl's naive, prime and dapo managers do (batch's calls with lists "
                              "are not)"));
    }
  }
  for (const char* key : {"reward_model.reward_kwargs.overlong_buffer_cfg.enable",
                          "reward.reward_kwargs.overlong_buffer_cfg.enable"}) {
    if (const Json* overlong = Take(key);
        overlong != nullptr && !(overlong->is_boolean() && !overlong->get<bool>())) {
      Error(key, "DAPO's overlong penalty shapes the reward by length, which rlhfd does not");
    }
  }
  if (enable) {
    if (!custom.empty()) {
      Error(custom,
            "with reward_model.enable verl scores with the reward model and leaves the "
            "function unused; keep one of them");
      return;
    }
    if (path == nullptr) {
      Error("reward_model.model.path", "reward_model.enable needs the reward model's path");
      return;
    }
    Map("reward_model.model.path", "roles.reward.model", Paths("reward_model.model.path", *path));
    return;
  }
  // A custom function replaces verl's default reward.
  if (!custom.empty()) return;
  // verl's default reward picks a rule by each row's data_source.
  Set(&out_.config, "roles.reward.rule", "auto");
  out_.mapped.push_back("(verl's default reward) -> roles.reward.rule: auto");
}

}  // namespace rlhfd::config::verl_conversion
