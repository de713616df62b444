// verl config → rlhfd config; see verl_import.h. The converter's shared parts and the PPO
// config's sections (verl_converter.h); its reward sections in verl_reward_import.cc, an SFT
// config's own in verl_sft_import.cc.
#include "common/config/verl_import.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/algorithms/algorithm_traits.h"
#include "common/config/hydra_compose.h"
#include "common/config/proto_json_schema.h"
#include "common/config/verl_compose.h"
#include "common/config/verl_converter.h"
#include "common/config/verl_interpolation.h"
#include "common/config/verl_key_tables.h"
#include "common/status/status_macros.h"
#include "common/util/text.h"
#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::config {
namespace verl_conversion {

using hydra::Set;
using verl_keys::DirectTable;
using verl_keys::HarmlessTable;
using verl_keys::IsVerlNeutral;
using verl_keys::Unset;
using verl_keys::UnsupportedTable;

VerlConversion Converter::Run() {
  if (sft_) return RunSft();
  Direct();
  Strategy("actor_rollout_ref.actor.strategy", "roles.actor.train.zero_stage");
  Strategy("critic.strategy", "roles.critic.train.zero_stage");
  TargetModules();
  Schedule(kActor, "roles.actor.train");
  Schedule("critic.", "roles.critic.train");
  ClipRatio();
  PolicyLoss();
  Kl();
  Rollout();
  Placement();
  Reward();
  Trainer();
  Name();
  Critic();
  Rest();
  return Finish();
}

VerlConversion Converter::Finish() {
  Unresolved(out_.config, "");
  for (const std::string& key : consumed_) {
    // An SFT run's: the keys its config has (the PPO conversion's code reads others too).
    if (!sft_ || flat_.count(key)) out_.read.push_back(Shown(key));
  }
  return std::move(out_);
}

std::string Converter::Shown(const std::string& key) const {
  if (!sft_) return key;
  const std::string sft = verl_keys::PpoKeyAsSft(key);
  const auto typed = typed_.find(sft);
  return typed != typed_.end() ? typed->second : sft;
}

const Json* Converter::Take(const std::string& key) {
  consumed_.insert(key);
  auto it = flat_.find(key);
  if (it == flat_.end() || Unset(it->second)) return nullptr;
  if (HasInterpolation(it->second)) {
    auto why = unresolved_.find(key);
    Error(key, absl::StrCat("'", Text(it->second), "' cannot be resolved: ",
                            why == unresolved_.end() ? "an interpolation" : why->second));
    return nullptr;
  }
  return &it->second;
}

void Converter::Map(const std::string& from, const std::string& to, Json value) {
  Set(&out_.config, to, std::move(value));
  out_.mapped.push_back(absl::StrCat(Shown(from), " -> ", to));
}

void Converter::Error(const std::string& ppo_key, absl::string_view why) {
  const std::string key = Shown(ppo_key);
  if (!noted_.insert(key).second) return;
  out_.errors.push_back(absl::StrCat(key, ": not supported (", why, ")"));
  out_.notes.push_back({key, std::string(why), /*refused=*/true});
}

void Converter::Warn(const std::string& ppo_key, absl::string_view why) {
  const std::string key = Shown(ppo_key);
  if (!noted_.insert(key).second) return;
  out_.warnings.push_back(absl::StrCat(key, ": ignored (", why, ")"));
  out_.notes.push_back({key, std::string(why), /*refused=*/false});
}

void Converter::Unresolved(const Json& node, const std::string& path) {
  if (node.is_object()) {
    for (const auto& [key, value] : node.items()) {
      Unresolved(value, path.empty() ? key : path + "." + key);
    }
  } else if (HasInterpolation(node)) {
    Error(path, absl::StrCat("'", Text(node), "' is an interpolation that was not resolved"));
  }
}

std::string Converter::Text(const Json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

void Converter::Direct() {
  for (const auto& [from, to] : DirectTable()) {
    // The critic's keys are placed by Critic(), once it is known whether there is a critic.
    if (absl::StartsWith(from, "critic.")) continue;
    const Json* value = Take(from);
    // verl's 0 validation generations still prints a sample per step from its reward manager;
    // rlhfd's default samples stand in for that unless the run asks for a number.
    if (from == "trainer.log_val_generations" && !user_set_.count(from)) continue;
    if (value != nullptr) Map(from, to, Paths(from, *value));
  }
}

Json Converter::Paths(const std::string& key, Json value) {
  const bool path = key == "actor_rollout_ref.model.path" || key == "critic.model.path" ||
                    key == "data.train_files" || key == "data.val_files" ||
                    key == "trainer.default_local_dir" || key == "reward_model.model.path" ||
                    key == "actor_rollout_ref.model.lora_adapter_path" ||
                    absl::EndsWith(key, "custom_reward_function.path");
  if (!path) return value;
  const char* home = std::getenv("HOME");
  const auto expand = [&](Json& item) {
    if (!item.is_string()) return;
    std::string text = item.get<std::string>();
    if (home != nullptr && (text == "~" || absl::StartsWith(text, "~/"))) {
      text = std::string(home) + text.substr(1);
    }
    item = text;
  };
  if (value.is_array()) {
    for (Json& item : value) expand(item);
  } else {
    expand(value);
  }
  return value;
}

void Converter::TargetModules() {
  const std::string key = "actor_rollout_ref.model.target_modules";
  const Json* value = Take(key);
  if (value == nullptr) return;
  Map(key, "model.target_modules", value->is_array() ? *value : Json::array({*value}));
}

void Converter::Strategy(const std::string& key, const std::string& target) {
  const Json* value = Take(key);
  if (value == nullptr) return;
  const std::string strategy = Text(*value);
  if (strategy == "fsdp" || strategy == "fsdp2") {
    Map(key, target, 3);
  } else {
    Error(key, absl::StrCat("'", strategy, "': rlhfd shards like FSDP (ZeRO-3, or ZeRO-2 with ",
                            target, ": 2); Megatron is not supported"));
  }
}

void Converter::Schedule(const std::string& prefix, const std::string& train) {
  const std::string optim = prefix + "optim.";
  // verl's optimizer config: a warmup_style (deprecated) replaces lr_scheduler_type.
  const Json* style_value = Take(optim + "warmup_style");
  std::string style_key = optim + "warmup_style";
  if (const Json* scheduler = Take(optim + "lr_scheduler_type"); style_value == nullptr) {
    style_value = scheduler;
    style_key = optim + "lr_scheduler_type";
  }
  if (style_value != nullptr) {
    const std::string style = Text(*style_value);
    if (style == "constant" || style == "cosine") {
      Map(style_key, train + ".lr_schedule", style);
    } else {
      Error(style_key, absl::StrCat("'", style, "': schedules are constant, cosine, linear"));
    }
  }
  if (const Json* betas = Take(optim + "betas")) {
    if (betas->is_array() && betas->size() == 2) {
      Map(optim + "betas", train + ".adam_beta1", (*betas)[0]);
      Map(optim + "betas", train + ".adam_beta2", (*betas)[1]);
    } else {
      Error(optim + "betas", "expected [beta1, beta2]");
    }
  }
  // verl 0.9's engine clips with optim.clip_grad (optim.grad_clip, deprecated, replaces it);
  // the role's own grad_clip is no longer read there.
  std::string clip_key = optim + "grad_clip";
  const Json* clip = Take(clip_key);
  if (const Json* norm = Take(optim + "clip_grad"); clip == nullptr) {
    clip = norm;
    clip_key = optim + "clip_grad";
  }
  if (clip != nullptr) Map(clip_key, train + ".grad_clip", *clip);
  const std::string role_clip = prefix + "grad_clip";
  Take(role_clip);
  if (user_set_.count(role_clip)) {
    Warn(role_clip, absl::StrCat("verl 0.9 clips gradients with ", clip_key,
                                 "; this key is "
                                 "not read"));
  }
  const Json* steps = Take(optim + "lr_warmup_steps");
  const Json* ratio = Take(optim + "lr_warmup_steps_ratio");
  Take(optim + "total_training_steps");  // verl fills it in at run time.
  if (steps != nullptr && steps->is_number() && steps->get<double>() >= 0) {
    Map(optim + "lr_warmup_steps", train + ".lr_warmup_steps", *steps);
  } else if (ratio != nullptr && ratio->is_number() && ratio->get<double>() > 0) {
    const auto total = flat_.find("trainer.total_training_steps");
    if (total != flat_.end() && total->second.is_number() && total->second.get<double>() >= 0 &&
        total->second.get<double>() < 1e15) {
      Map(optim + "lr_warmup_steps_ratio", train + ".lr_warmup_steps",
          static_cast<int64_t>(std::floor(ratio->get<double>() * total->second.get<double>())));
    } else {
      Error(optim + "lr_warmup_steps_ratio",
            "a ratio needs trainer.total_training_steps; give optim.lr_warmup_steps instead");
    }
  }
}

void Converter::ClipRatio() {
  const Json* both = Take(std::string(kActor) + "clip_ratio");
  if (both == nullptr) return;
  for (const std::string side : {"low", "high"}) {
    const auto own = flat_.find(absl::StrCat(kActor, "clip_ratio_", side));
    if (own == flat_.end() || Unset(own->second)) {
      Map(std::string(kActor) + "clip_ratio", "algorithm.clip_ratio_" + side, *both);
    } else if (user_set_.count(std::string(kActor) + "clip_ratio") &&
               !user_set_.count(own->first)) {
      Warn(std::string(kActor) + "clip_ratio",
           absl::StrCat("verl uses ", own->first, " (", Text(own->second), ") over it"));
    }
  }
}

void Converter::PolicyLoss() {
  const std::string key = std::string(kActor) + "policy_loss.loss_mode";
  const Json* value = Take(key);
  if (value == nullptr) return;
  // The losses rlhfd computes are its enum's values, by their config names.
  std::vector<std::string> implemented;
  const google::protobuf::EnumDescriptor* losses = v1::PolicyLoss_descriptor();
  for (int i = 1; i < losses->value_count(); ++i) {
    implemented.push_back(EnumConfigName(*losses->value(i)));
  }
  const std::string mode = Text(*value);
  if (std::find(implemented.begin(), implemented.end(), mode) != implemented.end()) {
    Map(key, "algorithm.policy_loss", mode);
  } else {
    Error(key, absl::StrCat("'", mode, "': rlhfd computes the policy losses ",
                            absl::StrJoin(implemented, ", ")));
  }
}

bool Converter::Switch(const std::string& key) {
  const Json* value = Take(key);
  if (value == nullptr) return false;
  if (!value->is_boolean()) {
    // Read as off, a 'yes' (YAML 1.1's true) or 1 would quietly change the run.
    Error(key, absl::StrCat("'", Text(*value), "': expected true or false"));
    return false;
  }
  return value->get<bool>();
}

void Converter::Kl() {
  const bool use_loss = Switch(std::string(kActor) + "use_kl_loss");
  const bool use_reward = Switch("algorithm.use_kl_in_reward");
  const Json* loss_coef = Take(std::string(kActor) + "kl_loss_coef");
  const Json* loss_type = Take(std::string(kActor) + "kl_loss_type");
  const Json* penalty = Take("algorithm.kl_penalty");
  const Json* controller = Take("algorithm.kl_ctrl.type");
  const Json* reward_coef = Take("algorithm.kl_ctrl.kl_coef");
  const Json* target = Take("algorithm.kl_ctrl.target_kl");
  const Json* horizon = Take("algorithm.kl_ctrl.horizon");
  if (use_loss && use_reward) {
    Error("algorithm.use_kl_in_reward",
          "with actor.use_kl_loss too: rlhfd applies the KL one way, algorithm.kl.mode loss or "
          "in_reward");
    return;
  }
  const auto estimator = [&](const std::string& key, const Json* value) {
    if (value == nullptr) return;
    const std::string name = Text(*value);
    if (name == "kl" || name == "k1" || name == "mse" || name == "k2" || name == "low_var_kl" ||
        name == "k3") {
      Map(key, "algorithm.kl.estimator", name);
    } else {
      Error(key, absl::StrCat("'", name, "': estimators are kl (k1), mse (k2), low_var_kl (k3)"));
    }
  };
  if (use_loss) {
    Map(std::string(kActor) + "use_kl_loss", "algorithm.kl.mode", "loss");
    if (loss_coef) Map(std::string(kActor) + "kl_loss_coef", "algorithm.kl.coef", *loss_coef);
    estimator(std::string(kActor) + "kl_loss_type", loss_type);
  } else if (use_reward) {
    Map("algorithm.use_kl_in_reward", "algorithm.kl.mode", "in_reward");
    if (reward_coef) Map("algorithm.kl_ctrl.kl_coef", "algorithm.kl.coef", *reward_coef);
    if (controller) Map("algorithm.kl_ctrl.type", "algorithm.kl.controller", *controller);
    if (target) Map("algorithm.kl_ctrl.target_kl", "algorithm.kl.target", *target);
    if (horizon) Map("algorithm.kl_ctrl.horizon", "algorithm.kl.horizon", *horizon);
    estimator("algorithm.kl_penalty", penalty);
  }
  const bool has_reference =
      out_.config.contains("roles") && out_.config["roles"].contains("reference");
  if ((use_loss || use_reward) && !has_reference) {
    Set(&out_.config, "roles.reference", Json::object());
  } else if (!use_loss && !use_reward && has_reference) {
    // verl loads no reference without a KL; rlhfd refuses an unused role.
    out_.config["roles"].erase("reference");
    const auto set = user_set_.lower_bound("actor_rollout_ref.ref.");
    if (set != user_set_.end() && absl::StartsWith(*set, "actor_rollout_ref.ref.")) {
      Warn("actor_rollout_ref.ref", "no KL is used, so there is no reference model");
    }
  }
}

void Converter::Rollout() {
  if (const Json* name = Take(std::string(kRollout) + "name")) {
    if (user_set_.count(std::string(kRollout) + "name")) {
      Warn(std::string(kRollout) + "name",
           absl::StrCat("'", Text(*name),
                        "': ", HarmlessTable().at(std::string(kRollout) + "name")));
    }
  }
  // verl's default tensor_model_parallel_size is 2: where the GPUs do not divide by it and the
  // script left it at that, each GPU generates with the whole model (tp 1), said so. Another
  // value is kept as it is, for the validator to judge.
  const std::string tp_key = std::string(kRollout) + "tensor_model_parallel_size";
  const Json* tp = Take(tp_key);
  if (tp == nullptr) return;
  const int64_t gpus = ActorGpus();
  if (!user_set_.count(tp_key) && tp->is_number_integer() && tp->get<int64_t>() > 1 &&
      gpus % tp->get<int64_t>() != 0) {
    Map(tp_key, "roles.actor.rollout.tp", 1);
    Warn(tp_key, absl::StrCat("verl's default ", Text(*tp), " does not divide the job's ", gpus,
                              gpus == 1 ? " GPU" : " GPUs",
                              "; each generates with the whole model (tp 1)"));
  } else {
    Map(tp_key, "roles.actor.rollout.tp", *tp);
  }
}

bool Converter::IsCount(const Json& value) {
  return value.is_number_integer() && value.get<int64_t>() >= 1 &&
         value.get<int64_t>() <= kMaxCount;
}

int64_t Converter::Number(const char* key, int64_t fallback) const {
  // Placement refuses what is not a count.
  const auto it = flat_.find(key);
  return it != flat_.end() && IsCount(it->second) ? it->second.get<int64_t>() : fallback;
}

int64_t Converter::ActorGpus() const {
  return Number("trainer.n_gpus_per_node", 8) * Number("trainer.nnodes", 1);
}

void Converter::Placement() {
  // Read by ActorGpus(); consumed here, where they land.
  for (const char* key : {"trainer.n_gpus_per_node", "trainer.nnodes"}) {
    const Json* count = Take(key);
    if (count != nullptr && !IsCount(*count)) {
      Error(key,
            absl::StrCat("'", Text(*count), "': expected a whole number from 1 to ", kMaxCount));
    }
  }
  const Json* hybrid = Take("actor_rollout_ref.hybrid_engine");
  if (hybrid != nullptr && hybrid->is_boolean() && !hybrid->get<bool>()) {
    Error("actor_rollout_ref.hybrid_engine",
          "false: give roles their own GPUs with rlhfd's placement: split and roles.*.gpus");
  }
  Map("trainer.n_gpus_per_node x trainer.nnodes", "roles.actor.gpus", ActorGpus());
  if (sft_ && !user_set_.count("trainer.n_gpus_per_node") && !user_set_.count("trainer.nnodes")) {
    Warn("trainer.n_gpus_per_node",
         absl::StrCat("verl's SFT trainer runs on torchrun's processes (--nproc_per_node x "
                      "--nnodes), which a config does not hold; the job asks for ",
                      ActorGpus(),
                      ": give trainer.n_gpus_per_node and nnodes as the torchrun "
                      "line does"));
  }
  Map(sft_ ? "(verl's SFT trainer: one pool)" : "actor_rollout_ref.hybrid_engine", "placement",
      "colocated");
  // verl's standalone rollout: nnodes > 0 gives the rollout nnodes x n_gpus_per_node GPUs of
  // its own (n_gpus_per_node defaults to the trainer's), a rollout pool in rlhfd.
  const int64_t nodes = Number("actor_rollout_ref.rollout.nnodes", 0);
  const int64_t per_node =
      Number("actor_rollout_ref.rollout.n_gpus_per_node", Number("trainer.n_gpus_per_node", 8));
  Take("actor_rollout_ref.rollout.nnodes");
  Take("actor_rollout_ref.rollout.n_gpus_per_node");
  if (nodes > 0) {
    Map("actor_rollout_ref.rollout.nnodes x n_gpus_per_node", "roles.rollout.gpus",
        nodes * per_node);
  }
}

void Converter::Trainer() {
  if (const Json* save = Take("trainer.save_freq"); save != nullptr && !save->is_number()) {
    // verl's SFT trainer also takes after_each_epoch; an epoch's steps depend on the data.
    Error("trainer.save_freq",
          absl::StrCat("'", Text(*save), "': give a number of steps (-1: never)"));
  } else if (save != nullptr) {
    // verl's SFT trainer saves after its last step whatever save_freq is (save_every 0).
    Map("trainer.save_freq", "trainer.save_every",
        save->get<int64_t>() < 0 ? Json(sft_ ? 0 : -1) : *save);
  }
  // verl keeps actor and critic checkpoints apart; a step directory here holds both, so it
  // keeps as many as the larger asks for (null or <= 0: all, as in verl).
  int64_t keep = 0;
  std::vector<std::string> keys;
  for (const char* key : {"trainer.max_actor_ckpt_to_keep", "trainer.max_critic_ckpt_to_keep"}) {
    const Json* value = Take(key);
    if (value == nullptr) continue;
    if (!value->is_number_integer()) {
      Error(key, absl::StrCat("'", Text(*value), "': expected a whole number or null"));
      continue;
    }
    keys.push_back(key);
    keep = std::max(keep, value->get<int64_t>());
  }
  if (!keys.empty()) {
    Map(absl::StrJoin(keys, " / "), "trainer.max_ckpt_to_keep", std::max<int64_t>(keep, 0));
  }
  if (const Json* test = Take("trainer.test_freq"); test != nullptr && !test->is_number()) {
    Error("trainer.test_freq",
          absl::StrCat("'", Text(*test), "': give a number of steps (-1: at the end only)"));
  } else if (test != nullptr) {
    Map("trainer.test_freq", "trainer.val_every", test->get<int64_t>() < 0 ? Json(0) : *test);
  }
  if (const Json* mode = Take("trainer.resume_mode")) {
    const std::string text = Text(*mode);
    if (text == "auto" || text == "disable") {
      Map("trainer.resume_mode", "trainer.resume", text == "auto");
    } else {
      Error("trainer.resume_mode", absl::StrCat("'", text,
                                                "': rlhfd resumes from the latest "
                                                "checkpoint in trainer.checkpoint_dir (auto) or "
                                                "not at all (disable)"));
    }
  }
  if (const Json* logger = Take("trainer.logger")) {
    Json loggers = Json::array();
    for (const Json& item : logger->is_array() ? *logger : Json::array({*logger})) {
      const std::string name = Text(item);
      if (name == "console" || name == "tensorboard") {
        loggers.push_back(name);
      } else if (name == "file") {
        loggers.push_back("jsonl");
      } else {
        Warn("trainer.logger", absl::StrCat("'", name,
                                            "': rlhfd logs to console, jsonl and "
                                            "tensorboard; ",
                                            name, " is left out"));
      }
    }
    Map("trainer.logger", "trainer.loggers", loggers);
  }
}

void Converter::Name() {
  std::string name = "verl-job";
  const auto it = flat_.find("trainer.experiment_name");
  if (it != flat_.end() && !Unset(it->second)) {
    name.clear();
    for (char c : Text(it->second)) {
      name += absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-' ? c : '-';
    }
    if (name.empty() || name.size() > 128) name = "verl-job";
  }
  Set(&out_.config, "name", name);
  out_.mapped.push_back("trainer.experiment_name -> name");
}

void Converter::Critic() {
  const auto estimator = out_.config.contains("algorithm")
                             ? out_.config["algorithm"].value("adv_estimator", Json("gae"))
                             : Json("gae");
  Set(&out_.config, "algorithm.adv_estimator", estimator);
  const algorithms::EstimatorTraits* traits =
      estimator.is_string() ? algorithms::FindEstimatorByName(estimator.get<std::string>())
                            : nullptr;
  const bool critic = traits != nullptr && traits->needs_critic;
  for (const auto& [from, to] : DirectTable()) {
    if (!absl::StartsWith(from, "critic.")) continue;
    const Json* value = Take(from);
    if (critic && value != nullptr) Map(from, to, Paths(from, *value));
  }
  if (critic) {
    Set(&out_.config, "roles.critic",
        out_.config["roles"].contains("critic") ? out_.config["roles"]["critic"] : Json::object());
  } else if (out_.config["roles"].contains("critic")) {
    // The critic's strategy and schedule (mapped with the actor's) go too: there is no critic.
    out_.config["roles"].erase("critic");
    std::erase_if(out_.mapped,
                  [](const std::string& line) { return absl::StartsWith(line, "critic."); });
  }
}

void Converter::Rest() {
  for (const auto& [key, value] : flat_) {
    // Hydra's composition list and settings are how a config is made, not what it says.
    if (consumed_.count(key) || !user_set_.count(key) || key == "defaults" ||
        absl::StartsWith(key, "hydra.")) {
      continue;
    }
    if (auto harmless = HarmlessTable().find(key); harmless != HarmlessTable().end()) {
      if (!IsVerlNeutral(key, value)) Warn(key, harmless->second);
    } else if (auto refused = UnsupportedTable().find(key); refused != UnsupportedTable().end()) {
      if (!IsVerlNeutral(key, value)) Error(key, refused->second);
    } else if (const std::string parent = verl_keys::RefusedParent(key); !parent.empty()) {
      // A setting inside a refused mapping (apply_chat_template_kwargs.enable_thinking, an
      // override_config entry): the mapping's own default is empty.
      Error(parent, UnsupportedTable().at(parent));
    } else if (!verl_keys_.count(key)) {
      // Hydra refuses such an override (without a leading +); verl's code never reads it.
      Warn(key,
           sft_ ? "not a key of verl 0.9's SFT trainer config" : "not a key of verl 0.9's config");
    } else if (const std::string* family = verl_keys::IgnoredFamily(key)) {
      Warn(key, *family);
    } else if (!Unset(value)) {
      Warn(key, "not a key rlhfd reads");
    }
  }
}

}  // namespace verl_conversion

absl::StatusOr<VerlConversion> ConvertVerlConfig(absl::string_view text, absl::string_view source,
                                                 const std::vector<std::string>& overrides,
                                                 VerlTrainer trainer) {
  try {
    ASSIGN_OR_RETURN(ComposedVerlRun run, ComposeVerlRun(trainer, text, source, overrides));
    std::vector<std::pair<std::string, std::string>> renamed;
    if (trainer == VerlTrainer::kSft) renamed = verl_conversion::InPpoNames(run);
    VerlConversion conversion =
        verl_conversion::Converter(trainer, std::move(run.flat), std::move(run.user_set),
                                   std::move(run.unresolved), std::move(run.verl_keys),
                                   std::move(renamed))
            .Run();
    conversion.verl_resolved = std::move(run.document);
    return conversion;
  } catch (const std::exception& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": cannot convert (", SanitizeForDisplay(error.what(), 200), ")"));
  }
}

const std::vector<std::pair<std::string, std::string>>& VerlDirectMappings() {
  return verl_keys::DirectTable();
}

}  // namespace rlhfd::config
