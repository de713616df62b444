// What an SFT config of verl's (its SFT trainer's, verl_defaults.h) adds to the conversion: its
// keys read in the PPO config's names, its own keys, and the keys and defaults of verl's old SFT
// trainer (verl_converter.h).
#include <algorithm>
#include <type_traits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/config/hydra_compose.h"
#include "common/config/verl_converter.h"
#include "common/config/verl_key_tables.h"

namespace rlhfd::config::verl_conversion {

using hydra::Set;
using verl_keys::Unset;

VerlConversion Converter::RunSft() {
  for (const auto& [old_key, new_key] : renamed_) {
    if (new_key.empty()) {
      Warn(old_key, "the old SFT trainer's name of a key the run also gives as verl 0.9.1's");
    } else {
      typed_[new_key] = old_key;
    }
  }
  if (OldSftTrainer()) OldDefaults();
  Direct();
  Strategy("actor_rollout_ref.actor.strategy", "roles.actor.train.zero_stage");
  TargetModules();
  Schedule(kActor, "roles.actor.train");
  Placement();
  Trainer();
  Name();
  Sft();
  Rest();
  return Finish();
}

bool Converter::OldSftTrainer() const {
  if (!typed_.empty()) return true;
  for (const char* key :
       {"sft.data.prompt_key", "sft.data.response_key", "sft.data.prompt_dict_keys",
        "sft.data.response_dict_keys", "sft.data.micro_batch_size", "sft.data.multiturn.enable"}) {
    if (user_set_.count(key)) return true;
  }
  return false;
}

void Converter::OldDefaults() {
  static constexpr std::pair<const char*, const char*> kOld[] = {
      {"optim.lr", "1e-5"},
      {"optim.betas", "[0.9, 0.95]"},
      {"optim.lr_warmup_steps_ratio", "0.1 (its warmup_steps_ratio)"},
      {"optim.lr_scheduler_type", "cosine (its lr_scheduler)"},
  };
  for (const auto& [key, old] : kOld) {
    const std::string ppo = verl_keys::SftKeyAsPpo(key);
    const auto now = flat_.find(ppo);
    if (user_set_.count(ppo) || now == flat_.end()) continue;
    Error(ppo, absl::StrCat("the run uses verl's old SFT trainer's keys, whose default for it "
                            "is ",
                            old, ", verl 0.9.1's ", Text(now->second), ": give it"));
  }
}

void Converter::Sft() {
  Set(&out_.config, "trainer.mode", "sft");
  out_.mapped.push_back("(verl's SFT trainer) -> trainer.mode");
  if (const Json* batch = Take("sft.data.train_batch_size")) {
    Map("sft.data.train_batch_size", "data.train_batch_size", *batch);
    Map("sft.data.train_batch_size", "roles.actor.train.ppo_mini_batch_size", *batch);
  }
  if (const Json* length = Take("sft.data.max_length")) {
    Map("sft.data.max_length", "data.max_prompt_length", *length);
    Map("sft.data.max_length", "data.max_response_length", *length);
    const auto truncation = flat_.find("data.truncation");
    if (truncation != flat_.end() && !Unset(truncation->second) &&
        Text(truncation->second) != "error") {
      Error("data.truncation",
            absl::StrCat("'", Text(truncation->second),
                         "' with data.max_length: verl cuts the end of a conversation longer "
                         "than max_length in all, rlhfd the prompt and the response each at its "
                         "own bound; set data.truncation=error, or data.max_prompt_length, "
                         "max_response_length and truncation in the converted config"));
    }
  }
  // verl's SFT trainer validates (by the loss, as rlhfd's SFT jobs without a reward do) after
  // steps only, never before the first.
  if (const auto val = flat_.find("data.val_files"); val != flat_.end() && !Unset(val->second)) {
    Set(&out_.config, "trainer.val_before_train", false);
    out_.mapped.push_back("(verl's SFT trainer validates after steps) -> trainer.val_before_train");
  }
  if (const Json* keep = Take("sft.trainer.max_ckpt_to_keep")) {
    if (keep->is_number_integer()) {
      Map("sft.trainer.max_ckpt_to_keep", "trainer.max_ckpt_to_keep",
          std::max<int64_t>(keep->get<int64_t>(), 0));
    } else {
      Error("sft.trainer.max_ckpt_to_keep",
            absl::StrCat("'", Text(*keep), "': expected a whole number or null"));
    }
  }
  // verl's MultiTurnSFTDataset: a row's own enable_thinking, else this default, else
  // apply_chat_template_kwargs' (mapped by Direct()).
  if (const Json* thinking = Take("sft.data.enable_thinking_default")) {
    if (thinking->is_boolean()) {
      Map("sft.data.enable_thinking_default", "data.enable_thinking", *thinking);
    } else if (Text(*thinking) != "none") {
      Error("sft.data.enable_thinking_default",
            absl::StrCat("'", Text(*thinking), "': true, false or none"));
    }
  }
  SingleTurnRows();
}

void Converter::SingleTurnRows() {
  const Json* enable = Take("sft.data.multiturn.enable");
  const std::vector<std::string> keys = {"sft.data.prompt_key", "sft.data.prompt_dict_keys",
                                         "sft.data.response_key", "sft.data.response_dict_keys"};
  bool given = false;
  for (const std::string& key : keys) given = Take(key) != nullptr || given;
  if (enable != nullptr && !enable->is_boolean()) {
    Error("sft.data.multiturn.enable", absl::StrCat("'", Text(*enable), "': true or false"));
    return;
  }
  // The old trainer read single-turn rows unless told otherwise; verl 0.9.1's reads
  // conversations only.
  const bool multi_turn = enable != nullptr ? enable->get<bool>() : !(given || OldSftTrainer());
  if (multi_turn) {
    for (const std::string& key : keys) {
      if (user_set_.count(key)) {
        Warn(key,
             "read by verl's old SFT trainer for single-turn rows only, and "
             "data.multiturn.enable is true");
      }
    }
    return;
  }
  for (const auto& [side, fallback] :
       {std::pair<std::string, std::string>{"prompt", "question"}, {"response", "answer"}}) {
    const std::string key = absl::StrCat("sft.data.", side, "_key");
    const std::string path_key = absl::StrCat("sft.data.", side, "_dict_keys");
    const Json* name = Take(key);
    const Json* path = Take(path_key);
    if (name != nullptr && !name->is_string()) {
      Error(key, absl::StrCat("'", Text(*name), "': expected the key of a column"));
      continue;
    }
    std::string dotted = name != nullptr ? Text(*name) : fallback;
    if (path != nullptr) {
      if (!path->is_array() || !std::all_of(path->begin(), path->end(), [](const Json& part) {
            return part.is_string() || part.is_number_integer();
          })) {
        Error(path_key, absl::StrCat("'", Text(*path), "': expected a list of keys"));
        continue;
      }
      for (const Json& part : *path) absl::StrAppend(&dotted, ".", Text(part));
    }
    Map(name != nullptr   ? key
        : path != nullptr ? path_key
                          : "sft.data.multiturn.enable",
        absl::StrCat("data.", side, "_key"), dotted);
  }
}

// An SFT run's keys of verl's old SFT trainer read as verl 0.9.1's (returned: each old key with
// the new one, or "" where the run gives the new one too), then every key in the PPO config's
// names (SftKeyAsPpo), so the converter's tables read them.
std::vector<std::pair<std::string, std::string>> InPpoNames(ComposedVerlRun& run) {
  std::vector<std::pair<std::string, std::string>> renamed;
  for (const auto& [old_key, new_key] : verl_keys::LegacySftRenames()) {
    std::vector<std::string> found;
    for (const auto& [key, value] : run.flat) {
      if (key == old_key || absl::StartsWith(key, old_key + ".")) found.push_back(key);
    }
    for (const std::string& key : found) {
      const std::string target = new_key + key.substr(old_key.size());
      // verl 0.9.1's own key wins where the run gives it too, even at its default value.
      const bool kept = !run.written.count(target);
      if (kept) {
        run.flat[target] = run.flat[key];
        run.user_set.insert(target);
        if (auto why = run.unresolved.find(key); why != run.unresolved.end()) {
          run.unresolved[target] = why->second;
        }
      }
      renamed.emplace_back(key, kept ? target : "");
      run.flat.erase(key);
      run.user_set.erase(key);
    }
  }
  // A key neither verl 0.9.1's SFT trainer nor its old one has (a PPO key, say) stays apart as
  // "sft." + its name, which no table maps: listed as not a key of the SFT config.
  const std::set<std::string> sft_keys = run.verl_keys;
  const auto as_ppo = [&](const std::string& key) {
    std::string ppo = verl_keys::SftKeyAsPpo(key);
    // Known: a key of the config, inside one of its mappings (override_config.x), the SFT
    // trainer's own, or one of its sections' keys the tables know in the PPO config's names
    // (optim.grad_clip, the deprecated name verl still reads); not a PPO config's own key.
    bool known = sft_keys.count(key) || absl::StartsWith(ppo, "sft.") ||
                 (ppo != key && verl_keys::Known(ppo));
    for (size_t dot = key.rfind('.'); !known && dot != std::string::npos && dot > 0;
         dot = key.rfind('.', dot - 1)) {
      known = sft_keys.count(key.substr(0, dot)) > 0;
    }
    return known ? ppo : absl::StrCat("sft.", key);
  };
  const auto rename = [&](auto& keyed) {
    std::remove_reference_t<decltype(keyed)> out;
    for (auto& item : keyed) {
      if constexpr (std::is_same_v<std::decay_t<decltype(item)>, std::string>) {
        out.insert(as_ppo(item));
      } else {
        out.emplace(as_ppo(item.first), std::move(item.second));
      }
    }
    keyed = std::move(out);
  };
  rename(run.flat);
  rename(run.user_set);
  rename(run.unresolved);
  rename(run.verl_keys);
  return renamed;
}

}  // namespace rlhfd::config::verl_conversion
