// The converter of a verl config, composed and resolved (verl_compose.h), into an rlhfd config,
// shared by both of verl's trainers: verl_import.cc defines the PPO config's sections and the
// helpers, verl_sft_import.cc what an SFT config adds. Internal to convert-verl (its interface is
// verl_import.h).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/config/verl_compose.h"
#include "common/config/verl_defaults.h"
#include "common/config/verl_import.h"

namespace rlhfd::config::verl_conversion {

using Json = nlohmann::json;

inline constexpr char kActor[] = "actor_rollout_ref.actor.";
inline constexpr char kRollout[] = "actor_rollout_ref.rollout.";

class Converter {
 public:
  // `flat`: the config on verl's defaults, interpolations resolved; `user_set`: the keys whose
  // value the run gives (differs from verl's default); `unresolved`: keys whose interpolation
  // could not be resolved, with why.
  // `renamed`: an SFT config's keys of verl's old SFT trainer, each with the key it was read as
  // (or "" where the run gives that key too, which wins).
  Converter(VerlTrainer trainer, std::map<std::string, Json> flat, std::set<std::string> user_set,
            std::map<std::string, std::string> unresolved, std::set<std::string> verl_keys,
            std::vector<std::pair<std::string, std::string>> renamed = {})
      : sft_(trainer == VerlTrainer::kSft),
        flat_(std::move(flat)),
        user_set_(std::move(user_set)),
        unresolved_(std::move(unresolved)),
        verl_keys_(std::move(verl_keys)),
        renamed_(std::move(renamed)) {}
  VerlConversion Run();

 private:
  // Shared by both trainers' conversions (verl_import.cc).
  VerlConversion Finish();
  // A key as the run names it: an SFT config's keys are handled in the PPO config's names, and
  // the old SFT trainer's keys as verl 0.9.1's.
  std::string Shown(const std::string& key) const;
  // The value of `key` when it is set (not null); consumes it. An interpolation that could not
  // be resolved is refused here rather than copied as text.
  const Json* Take(const std::string& key);
  void Map(const std::string& from, const std::string& to, Json value);
  // Each key not honoured is listed once, with why.
  void Error(const std::string& ppo_key, absl::string_view why);
  void Warn(const std::string& ppo_key, absl::string_view why);
  // Nothing unresolved reaches the output: a `${...}` left in it is refused, naming the key.
  void Unresolved(const Json& node, const std::string& path);
  static std::string Text(const Json& value);
  // verl's paths are often ~/...: expanded here, on the submitting machine, where ~ means what
  // the user meant. Parquet data files are kept as they are: the controller reads them.
  Json Paths(const std::string& key, Json value);
  // A whole number from 1 to kMaxCount (GPUs a node, nodes).
  static constexpr int64_t kMaxCount = 1 << 20;
  static bool IsCount(const Json& value);
  // `key`'s count, or `fallback` where it is unset or not a count.
  int64_t Number(const char* key, int64_t fallback) const;
  // A switch of verl's that the conversion reads itself: its value, false where unset, and an
  // error naming it where it is not true or false.
  bool Switch(const std::string& key);
  // trainer.n_gpus_per_node x trainer.nnodes, at verl's defaults (8, 1) where unset.
  int64_t ActorGpus() const;

  // The sections of verl's PPO config, and the actor's parts an SFT config shares
  // (verl_import.cc).
  void Direct();
  // verl's target_modules is a string (all-linear) or a list; rlhfd's is a list.
  void TargetModules();
  void Strategy(const std::string& key, const std::string& target);
  void Schedule(const std::string& prefix, const std::string& train);
  // verl's policy loss takes clip_ratio_low / _high, and clip_ratio only where one is null.
  void ClipRatio();
  // actor.policy_loss.loss_mode to algorithm.policy_loss where rlhfd computes that loss.
  void PolicyLoss();
  // verl has two switches (a KL loss on the actor, a KL penalty in the reward); rlhfd one mode.
  void Kl();
  void Rollout();
  // verl's hybrid engine puts actor, rollout, reference (and by default critic and reward
  // model) on one resource pool of every GPU: colocated.
  void Placement();
  // verl's custom_reward_function (top level, or under reward: in verl's newer layout), with
  // its reward_kwargs; the key it came from, or "" when none is set.
  std::string CustomRewardFunction();
  void Reward();
  void Trainer();
  // verl runs have no name; rlhfd jobs do: the experiment's.
  void Name();
  // A critic exactly when the estimator needs one, as verl decides (critic.enable: null).
  void Critic();
  // Whatever is left, where the run sets it away from verl's default: harmless keys warn, known
  // unsupported ones refuse, unknown ones warn.
  void Rest();

  // verl's SFT trainer (verl_sft_import.cc).
  // verl's SFT trainer: the actor's parts of the PPO conversion (its keys are read in the PPO
  // config's names, SftKeyAsPpo), then what only the SFT config says.
  VerlConversion RunSft();
  // Whether an SFT run is written for verl's old SFT trainer (fsdp_sft_trainer): it uses keys
  // only that trainer has.
  bool OldSftTrainer() const;
  // The old SFT trainer's defaults that verl 0.9.1 changed: a run written for it that leaves
  // them out meant the old values, which a conversion on 0.9.1's defaults would silently
  // replace (a learning rate 100 times larger); each is refused until the run gives it.
  void OldDefaults();
  // What an SFT config means beyond the actor's keys: trainer.mode sft, one optimiser step per
  // batch, the length bound, the checkpoints kept, and the single-turn rows of verl's old SFT
  // trainer.
  void Sft();
  // verl's old SFT trainer read single-turn rows unless data.multiturn.enable: the prompt under
  // prompt_key (then prompt_dict_keys, a path into it), the response under response_key (then
  // response_dict_keys).
  void SingleTurnRows();

  const bool sft_;
  std::map<std::string, Json> flat_;
  std::set<std::string> user_set_;
  std::map<std::string, std::string> unresolved_;
  std::set<std::string> verl_keys_;
  std::vector<std::pair<std::string, std::string>> renamed_;
  std::map<std::string, std::string> typed_;  // verl 0.9.1's name -> the old one the run used
  std::set<std::string> consumed_;
  std::set<std::string> noted_;
  VerlConversion out_{Json::object(), {}, {}, {}, {}, {}, nullptr};
};

// An SFT run's keys of verl's old SFT trainer read as verl 0.9.1's (returned: each old key with
// the new one, or "" where the run gives the new one too), then every key in the PPO config's
// names (SftKeyAsPpo), so the converter's tables read them.
std::vector<std::pair<std::string, std::string>> InPpoNames(ComposedVerlRun& run);

}  // namespace rlhfd::config::verl_conversion
