// What the verl key tables say of a key (its fate, its family, whether it is known or neutral)
// and the SFT trainer's key names; see verl_key_tables.h.
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/config/verl_key_tables.h"

namespace rlhfd::config::verl_keys {

using Json = nlohmann::json;

const std::string* IgnoredFamily(const std::string& key) {
  for (const auto& [part, why] : IgnoredFamilyTable()) {
    const bool match = part.front() == '.' ? absl::StrContains(key, part) ||
                                                 (part.back() != '.' && absl::EndsWith(key, part))
                                           : absl::StartsWith(key, part) || key == part;
    if (match) return &why;
  }
  return nullptr;
}

std::string Fate(const std::string& key) {
  for (const auto& [from, to] : DirectTable()) {
    if (from == key) return absl::StrCat("mapped to `", to, "`");
  }
  if (auto it = DerivedTable().find(key); it != DerivedTable().end()) {
    return absl::StrCat("derived: ", it->second);
  }
  if (auto it = UnsupportedTable().find(key); it != UnsupportedTable().end()) {
    return absl::StrCat("refused unless at verl's default: ", it->second);
  }
  if (auto it = HarmlessTable().find(key); it != HarmlessTable().end()) {
    return absl::StrCat("ignored: ", it->second);
  }
  if (const std::string* why = IgnoredFamily(key)) return absl::StrCat("ignored: ", *why);
  return "not read by rlhfd; listed as ignored when a run sets it";
}

namespace {

// SFT key (or prefix, ending in '.') → its PPO name; the first that matches wins.
constexpr std::pair<const char*, const char*> kSftAsPpo[] = {
    {"data.micro_batch_size_per_gpu", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"},
    {"data.max_token_len_per_gpu", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"},
    {"data.use_dynamic_bsz", "actor_rollout_ref.actor.use_dynamic_bsz"},
    {"engine.strategy", "actor_rollout_ref.actor.strategy"},
    {"model.", "actor_rollout_ref.model."},
    {"optim.", "actor_rollout_ref.actor.optim."},
    {"engine.", "actor_rollout_ref.actor.fsdp_config."},
    {"checkpoint.", "actor_rollout_ref.actor.checkpoint."},
    {"profiler.", "actor_rollout_ref.actor.profiler."},
};

// The SFT trainer's own keys (or prefixes), and those that mean something else there: "sft." +
// the key. The last six are verl's old SFT trainer's.
constexpr const char* kSftOwn[] = {
    "data.messages_key",
    "data.tools_key",
    "data.enable_thinking_key",
    "data.enable_thinking_default",
    "data.pad_mode",
    "data.max_length",
    "data.balance_dp_token",
    "data.num_workers",
    "data.ignore_input_ids_mismatch",
    "data.train_batch_size",
    "trainer.seed",
    "trainer.max_ckpt_to_keep",
    "trainer.profile_interval",
    "data.prompt_key",
    "data.response_key",
    "data.prompt_dict_keys",
    "data.response_dict_keys",
    "data.micro_batch_size",
    "data.multiturn.",
};

bool Matches(const std::string& key, absl::string_view pattern) {
  return pattern.back() == '.' ? absl::StartsWith(key, pattern) : key == pattern;
}

constexpr char kSftOwnPrefix[] = "sft.";

}  // namespace

std::string SftKeyAsPpo(const std::string& key) {
  for (const char* own : kSftOwn) {
    if (Matches(key, own)) return absl::StrCat(kSftOwnPrefix, key);
  }
  for (const auto& [sft, ppo] : kSftAsPpo) {
    if (Matches(key, sft)) return absl::StrCat(ppo, key.substr(std::string_view(sft).size()));
  }
  return key;
}

std::string PpoKeyAsSft(const std::string& key) {
  if (absl::StartsWith(key, kSftOwnPrefix)) return key.substr(sizeof(kSftOwnPrefix) - 1);
  for (const auto& [sft, ppo] : kSftAsPpo) {
    if (Matches(key, ppo)) return absl::StrCat(sft, key.substr(std::string_view(ppo).size()));
  }
  return key;
}

const std::map<std::string, std::string>& LegacySftRenames() {
  static const auto* table = new std::map<std::string, std::string>{
      {"model.partial_pretrain", "model.path"},
      {"model.strategy", "engine.strategy"},
      {"data.multiturn.messages_key", "data.messages_key"},
      {"data.multiturn.tools_key", "data.tools_key"},
      {"data.multiturn.enable_thinking_key", "data.enable_thinking_key"},
      {"optim.warmup_steps_ratio", "optim.lr_warmup_steps_ratio"},
      {"optim.lr_scheduler", "optim.lr_scheduler_type"},
      {"ulysses_sequence_parallel_size", "engine.ulysses_sequence_parallel_size"},
      {"use_remove_padding", "model.use_remove_padding"},
  };
  return *table;
}

bool Known(const std::string& key) {
  for (const auto& [from, to] : DirectTable()) {
    if (from == key) return true;
  }
  return DerivedTable().count(key) || HarmlessTable().count(key) || UnsupportedTable().count(key);
}

std::string RefusedParent(const std::string& key) {
  for (size_t dot = key.rfind('.'); dot != std::string::npos && dot > 0;
       dot = key.rfind('.', dot - 1)) {
    std::string parent = key.substr(0, dot);
    if (UnsupportedTable().count(parent)) return parent;
  }
  return "";
}

// Values that mean "not given": null (interpolations are resolved before the tables are read).
bool Unset(const Json& value) { return value.is_null(); }

// Whether a refused or ignored key's value is the one verl would have anyway.
bool IsVerlNeutral(const std::string& key, const Json& value) {
  if (Unset(value)) return true;
  if (value.is_boolean() && !value.get<bool>()) return true;  // a switch left off
  if (absl::EndsWith(key, "lora_rank") || absl::EndsWith(key, "lora.rank") ||
      key == "actor_rollout_ref.rollout.over_sample_rate") {
    return value.is_number() && value.get<double>() == 0;
  }
  if (absl::EndsWith(key, "ulysses_sequence_parallel_size")) {
    return value.is_number() && value.get<double>() == 1;
  }
  if (key == "actor_rollout_ref.model.override_config" || key == "critic.model.override_config") {
    return value.is_object() && value.empty();
  }
  if (key == "reward_model.reward_manager") {
    return value.is_string() && value.get<std::string>() == "naive";
  }
  return false;
}

}  // namespace rlhfd::config::verl_keys
