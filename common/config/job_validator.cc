// JobSpec validation rules; the checks are grouped by section in the order of the schema.
#include "common/config/job_validator.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/algorithms/algorithm_traits.h"
#include "common/config/config_checker.h"
#include "common/config/proto_json_schema.h"
#include "common/config/python_reward_limits.h"
#include "common/config/reward_rules.h"
#include "common/config/rollout_checks.h"
#include "common/config/supervised_checks.h"
#include "common/models/lora_targets.h"
#include "common/stages/response_samples.h"
#include "common/util/s3_uri.h"
#include "common/util/text.h"

namespace rlhfd::config {
namespace {

using v1::JobSpec;

const char* const kLoggers[] = {"console", "jsonl", "tensorboard"};
const char* const kChatTemplates[] = {"auto", "chatml", "llama3", "none"};

template <typename Range>
bool Contains(const Range& names, const std::string& name) {
  for (const char* candidate : names) {
    if (name == candidate) return true;
  }
  return false;
}

template <typename Range>
std::string Join(const Range& names) {
  std::string out;
  for (const char* name : names) absl::StrAppend(&out, out.empty() ? "" : ", ", name);
  return out;
}

template <typename Enum>
std::string Name(Enum value) {
  const auto* descriptor = google::protobuf::GetEnumDescriptor<Enum>()->FindValueByNumber(value);
  return descriptor ? EnumConfigName(*descriptor) : absl::StrCat(static_cast<int>(value));
}

// Records a derived key path.
void Derived(std::set<std::string>* derived, const std::string& path) {
  if (derived != nullptr) derived->insert(path);
}

bool IsPythonIdentifier(const std::string& name) {
  if (name.empty() || absl::ascii_isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

// roles.reward.custom_reward_function: checks what the controller can (the file itself is on
// the workers' machines, which may not be this one) and fills in the defaults.
void CompletePythonReward(Checker& check, v1::PythonRewardSpec* function) {
  const std::string path = "roles.reward.custom_reward_function";
  if (function->path().empty()) {
    check.Fail(path + ".path",
               "is required: the .py file that defines the reward function, as the workers see "
               "it");
  } else if (!absl::EndsWith(function->path(), ".py") &&
             !absl::StartsWith(function->path(), "pkg://")) {
    check.Fail(path + ".path", absl::StrCat("'", function->path(),
                                            "' is not a .py file (or pkg://module, as verl "
                                            "accepts)"));
  }
  if (function->name().empty()) function->set_name(kPythonRewardFunctionName);
  if (!IsPythonIdentifier(function->name())) {
    check.Fail(path + ".name",
               absl::StrCat("'", function->name(), "' is not the name of a Python function"));
  }
  if (function->processes() == 0) function->set_processes(kPythonRewardProcesses);
  check.Within(path + ".processes", function->processes(), 1, kMaxPythonRewardProcesses);
  if (function->timeout_s() == 0) function->set_timeout_s(kPythonRewardTimeoutS);
  check.Within(path + ".timeout_s", function->timeout_s(), 1e-3, kMaxPythonRewardTimeoutS);
  if (function->memory_limit_mb() == 0) function->set_memory_limit_mb(kPythonRewardMemoryLimitMb);
  if (function->memory_limit_mb() != -1) {
    check.Within(path + ".memory_limit_mb", static_cast<double>(function->memory_limit_mb()),
                 static_cast<double>(kMinPythonRewardMemoryLimitMb), 1 << 24);
  }
}

bool IsValidJobName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

// Derives dp from gpus / tp when unset, then checks the layout and batch arithmetic of one
// training role. `samples_per_step` is prompts per step; `n` responses per prompt.
void CheckTrain(Checker& check, const std::string& role, int gpus, v1::TrainSpec* train,
                int64_t prompts_per_step, int n, std::set<std::string>* derived) {
  const std::string path = "roles." + role + ".train";
  check.Within(path + ".tp", train->tp(), 1, kMaxGpus);
  check.Within(path + ".dp", train->dp(), 0, kMaxGpus);
  if (train->tp() < 1 || train->tp() > kMaxGpus || train->dp() < 0 || train->dp() > kMaxGpus) {
    return;
  }
  if (gpus % train->tp() != 0) {
    check.Fail(path + ".tp", absl::StrCat(train->tp(), " does not divide roles.", role,
                                          ".gpus (", gpus, ")"));
    return;
  }
  if (train->tp() > 1) {
    check.Fail(path + ".tp",
               absl::StrCat(train->tp(), ": the actor and critic updates run tensor-parallel "
                                         "size 1 for now; set it to 1 (shard with dp instead)"));
    return;
  }
  if (train->dp() == 0) {
    train->set_dp(gpus / train->tp());
    Derived(derived, path + ".dp");
  }
  // Both are at most kMaxGpus, so the product cannot overflow in 64 bits.
  const int64_t layout_gpus = int64_t{train->dp()} * train->tp();
  if (layout_gpus != gpus) {
    check.Fail(path, absl::StrCat("dp (", train->dp(), ") x tp (", train->tp(), ") = ",
                                  layout_gpus, " but roles.", role, ".gpus is ",
                                  gpus, "; set dp to ", gpus / train->tp(),
                                  " or leave it out to derive it"));
    return;
  }
  check.Within(path + ".ppo_mini_batch_size", train->ppo_mini_batch_size(), 1, kMaxBatch);
  check.Within(path + ".ppo_micro_batch_size_per_gpu", train->ppo_micro_batch_size_per_gpu(), 1,
               kMaxBatch);
  check.Within(path + ".ppo_max_token_len_per_gpu", train->ppo_max_token_len_per_gpu(), 1,
               kMaxTokens);
  if (train->zero_stage() != 2 && train->zero_stage() != 3) {
    check.Fail(path + ".zero_stage", absl::StrCat(train->zero_stage(), " must be 2 or 3"));
  }
  check.Above(path + ".lr", train->lr(), 0);
  check.Within(path + ".lr_warmup_steps", train->lr_warmup_steps(), 0, kMaxSteps);
  check.Within(path + ".min_lr_ratio", train->min_lr_ratio(), 0, 1);
  check.AtLeast(path + ".weight_decay", train->weight_decay(), 0);
  check.Within(path + ".adam_beta1", train->adam_beta1(), 0, 0.999999);
  check.Within(path + ".adam_beta2", train->adam_beta2(), 0, 0.999999);
  check.AtLeast(path + ".grad_clip", train->grad_clip(), 0);
  check.Within(path + ".ppo_epochs", train->ppo_epochs(), 1, 1000);
  check.Above(path + ".cliprange_value", train->cliprange_value(), 0);
  if (train->ppo_mini_batch_size() < 1 || train->ppo_micro_batch_size_per_gpu() < 1 ||
      train->ppo_mini_batch_size() > kMaxBatch) {
    return;
  }

  if (prompts_per_step % train->ppo_mini_batch_size() != 0) {
    check.Fail(path + ".ppo_mini_batch_size",
               absl::StrCat(train->ppo_mini_batch_size(),
                            " does not divide data.train_batch_size (", prompts_per_step,
                            "); choose a divisor of it"));
    return;
  }
  const int64_t responses_per_mini_batch = int64_t{train->ppo_mini_batch_size()} * n;
  if (responses_per_mini_batch % train->dp() != 0) {
    check.Fail(path + ".ppo_mini_batch_size",
               absl::StrCat(train->ppo_mini_batch_size(), " prompts x rollout.n (", n, ") = ",
                            responses_per_mini_batch, " responses do not split evenly over dp (",
                            train->dp(), ")"));
    return;
  }
  const int64_t per_gpu = responses_per_mini_batch / train->dp();
  if (!train->use_dynamic_bsz() && per_gpu % train->ppo_micro_batch_size_per_gpu() != 0) {
    check.Fail(path + ".ppo_micro_batch_size_per_gpu",
               absl::StrCat(train->ppo_micro_batch_size_per_gpu(),
                            " does not divide the per-GPU mini-batch of ", per_gpu,
                            " responses (ppo_mini_batch_size x n / dp)"));
  }
}

// Role GPUs of 0 mean "derive": the actor's GPUs when colocated, else `split_default`.
void CompleteRoleGpus(Checker& check, const std::string& path, bool colocated, int actor_gpus,
                      int split_default, int32_t* gpus, std::set<std::string>* derived) {
  if (*gpus == 0) {
    *gpus = colocated ? actor_gpus : split_default;
    Derived(derived, path);
  } else if (colocated && *gpus != actor_gpus) {
    check.Fail(path, absl::StrCat("placement colocated runs every role on the actor's ",
                                  actor_gpus, " GPUs; remove this key or set it to ",
                                  actor_gpus));
  }
  if (*gpus < 0 || *gpus > kMaxGpus) {
    check.Fail(path, absl::StrCat(*gpus, " must be in [1, ", kMaxGpus, "]"));
  }
}

}  // namespace

int TotalGpus(const JobSpec& spec) {
  const auto& roles = spec.roles();
  if (spec.placement() == v1::PLACEMENT_COLOCATED) {
    return roles.actor().gpus() + (roles.has_rollout() ? roles.rollout().gpus() : 0);
  }
  int total = roles.actor().gpus();
  if (roles.has_critic()) total += roles.critic().gpus();
  if (roles.has_reference()) total += roles.reference().gpus();
  total += roles.reward().gpus();
  return total + (roles.has_rollout() ? roles.rollout().gpus() : 0);
}

void CompleteAndValidateJobSpec(JobSpec* spec, ConfigErrors* errors,
                                std::set<std::string>* derived) {
  Checker check(errors);
  if (!IsValidJobName(spec->name())) {
    check.Fail("name", spec->name().empty()
                           ? "is required: give the job a name of letters, digits, '.', '_', '-'"
                           : "use 1-128 letters, digits, '.', '_' or '-'");
  }

  // model
  if (spec->model().path().empty()) {
    check.Fail("model.path", "is required: the Hugging Face model directory to start from");
  }
  if (!Contains(kChatTemplates, spec->model().chat_template())) {
    check.Fail("model.chat_template", absl::StrCat("'", spec->model().chat_template(),
                                                   "' is not one of: ", Join(kChatTemplates)));
  }

  const v1::ModelSpec& model = spec->model();
  const bool lora = model.lora_rank() > 0 || !model.lora_adapter_path().empty();
  check.Within("model.lora_rank", model.lora_rank(), 0, 1024);
  if (lora) {
    if (!(model.lora_alpha() > 0) || !std::isfinite(model.lora_alpha())) {
      check.Fail("model.lora_alpha", absl::StrCat(model.lora_alpha(), " must be positive"));
    }
    const std::vector<std::string> targets(model.target_modules().begin(),
                                           model.target_modules().end());
    if (absl::StatusOr<std::vector<std::string>> layers = models::ResolveLoraTargets(targets);
        !layers.ok()) {
      check.Fail("model.target_modules", std::string(absl::StripPrefix(
                                             layers.status().message(), "target_modules: ")));
    }
  }

  // data
  const auto& data = spec->data();
  if (data.train_files().empty()) {
    check.Fail("data.train_files",
               "is required: list at least one file of prompts (JSONL or Parquet)");
  }
  check.Within("data.max_prompt_length", data.max_prompt_length(), 1, 1 << 20);
  check.Within("data.max_response_length", data.max_response_length(), 1, 1 << 20);
  check.Within("data.train_batch_size", data.train_batch_size(), 1, kMaxBatch);
  if (data.answer_key().empty() || absl::StrContains(data.answer_key(), "..") ||
      absl::StartsWith(data.answer_key(), ".") || absl::EndsWith(data.answer_key(), ".")) {
    check.Fail("data.answer_key",
               absl::StrCat("'", data.answer_key(), "' must be a key or a dotted path of keys, "
                            "e.g. reward_model.ground_truth"));
  }

  // algorithm
  auto* algorithm = spec->mutable_algorithm();
  check.Within("algorithm.gamma", algorithm->gamma(), 0, 1);
  check.Within("algorithm.lam", algorithm->lam(), 0, 1);
  // 1 or more takes the lower bound 1 - low to 0 or below, where no ratio reaches it: no lower
  // clip (verl's CISPO example sets 10).
  check.Above("algorithm.clip_ratio_low", algorithm->clip_ratio_low(), 0);
  check.OpenInterval("algorithm.clip_ratio_high", algorithm->clip_ratio_high(), 0, 10);
  if (algorithm->clip_ratio_c() != 0 && !(algorithm->clip_ratio_c() > 1)) {
    check.Fail("algorithm.clip_ratio_c",
               absl::StrCat(algorithm->clip_ratio_c(), " must be > 1, or 0 to turn dual-clip off"));
  }
  check.AtLeast("algorithm.entropy_coeff", algorithm->entropy_coeff(), 0);
  check.Above("algorithm.tau_pos", algorithm->tau_pos(), 0);
  check.Above("algorithm.tau_neg", algorithm->tau_neg(), 0);
  const auto share = [&](const std::string& path, double value) {
    if (!(value > 0 && value <= 1)) {
      check.Fail(path, absl::StrCat(Number(value), " must be in (0, 1]"));
    }
  };
  share("algorithm.clip_cov_ratio", algorithm->clip_cov_ratio());
  share("algorithm.kl_cov_ratio", algorithm->kl_cov_ratio());
  if (!(algorithm->clip_cov_lb() < algorithm->clip_cov_ub())) {
    check.Fail("algorithm.clip_cov_ub",
               absl::StrCat(Number(algorithm->clip_cov_ub()), " must be above clip_cov_lb (",
                            Number(algorithm->clip_cov_lb()), ")"));
  }
  check.AtLeast("algorithm.ppo_kl_coef", algorithm->ppo_kl_coef(), 0);
  if (algorithm->policy_loss() == v1::POLICY_LOSS_DRO && !(algorithm->dro_beta() > 0)) {
    check.Fail("algorithm.dro_beta",
               absl::StrCat(Number(algorithm->dro_beta()), " must be > 0 with policy_loss dro"));
  }
  const v1::RolloutCorrectionSpec& correction = algorithm->rollout_correction();
  if (!correction.rollout_is().empty() && correction.rollout_is() != "token" &&
      correction.rollout_is() != "sequence") {
    check.Fail("algorithm.rollout_correction.rollout_is",
               absl::StrCat("'", SanitizeForDisplay(correction.rollout_is(), 40),
                            "' is not token, sequence or null (off)"));
  }
  check.Above("algorithm.rollout_correction.rollout_is_threshold",
              correction.rollout_is_threshold(), 0);
  check.AtLeast("algorithm.kl.coef", algorithm->kl().coef(), 0);
  const algorithms::KlModeTraits* kl_mode = algorithms::FindKlMode(algorithm->kl().mode());
  if (algorithm->kl().estimator() == v1::KL_ESTIMATOR_UNSPECIFIED) {
    algorithm->mutable_kl()->set_estimator(kl_mode != nullptr ? kl_mode->default_estimator
                                                              : v1::KL_ESTIMATOR_K3);
    Derived(derived, "algorithm.kl.estimator");
  }
  check.Above("algorithm.kl.target", algorithm->kl().target(), 0);
  check.Within("algorithm.kl.horizon", algorithm->kl().horizon(), 1, 1e15);

  // trainer.mode sft trains on conversations: no advantages, hence no estimator, critic,
  // groups or KL.
  const bool sft = spec->trainer().mode() == v1::TRAINER_MODE_SFT;
  if (sft) {
    CheckSupervised(check, *spec);
    if (algorithm->adv_estimator() != v1::ADVANTAGE_ESTIMATOR_UNSPECIFIED) {
      algorithm->set_adv_estimator(v1::ADVANTAGE_ESTIMATOR_UNSPECIFIED);
      Derived(derived, "algorithm.adv_estimator");
    }
  } else if (!spec->data().response_key().empty()) {
    check.Fail("data.response_key",
               "only trainer.mode sft reads responses from the data (RL jobs generate them); "
               "remove it");
  }

  // roles
  auto* roles = spec->mutable_roles();
  const bool colocated = spec->placement() == v1::PLACEMENT_COLOCATED;
  auto* actor = roles->mutable_actor();
  check.Within("roles.actor.gpus", actor->gpus(), 1, kMaxGpus);
  const int actor_gpus = actor->gpus() <= kMaxGpus ? actor->gpus() : 0;
  CheckRollout(check, *spec);
  const auto& rollout = actor->rollout();
  const auto& val = rollout.val_kwargs();
  check.AtLeast("roles.actor.rollout.val_kwargs.temperature", val.temperature(), 0);
  check.Within("roles.actor.rollout.val_kwargs.top_p", val.top_p(), 1e-9, 1);
  check.Within("roles.actor.rollout.val_kwargs.top_k", val.top_k(), -1, kMaxVocabulary);
  check.Within("roles.actor.rollout.val_kwargs.n", val.n(), 1, kMaxSamplesPerPrompt);
  const int n = std::clamp(rollout.n(), 1, kMaxSamplesPerPrompt);
  if (actor_gpus >= 1) {
    CheckTrain(check, "actor", actor_gpus, actor->mutable_train(), data.train_batch_size(), n,
               derived);
  }

  const auto estimator = algorithm->adv_estimator();
  const bool needs_critic = algorithms::NeedsCritic(*algorithm);
  if (algorithms::NeedsGroups(*algorithm) && rollout.n() < 2) {
    check.Fail("roles.actor.rollout.n",
               absl::StrCat(rollout.n(), " response per prompt leaves algorithm.adv_estimator ",
                            Name(estimator), " no group to compare; set n >= 2"));
  }
  if (needs_critic && !roles->has_critic()) {
    check.Fail("roles.critic",
               absl::StrCat("is required by algorithm.adv_estimator ", Name(estimator),
                            " (it needs a value model); add a critic or use a critic-free "
                            "estimator (",
                            algorithms::EstimatorNames([](const algorithms::EstimatorTraits& row) {
                              return !row.needs_critic;
                            }),
                            ")"));
  }
  if (!needs_critic && roles->has_critic() && !sft) {
    check.Fail("roles.critic",
               absl::StrCat("is unused by algorithm.adv_estimator ", Name(estimator),
                            "; remove it, or use ",
                            algorithms::EstimatorNames([](const algorithms::EstimatorTraits& row) {
                              return row.needs_critic;
                            })));
  }
  if (roles->has_critic()) {
    auto* critic = roles->mutable_critic();
    int32_t gpus = critic->gpus();
    CompleteRoleGpus(check, "roles.critic.gpus", colocated, actor_gpus, 1, &gpus, derived);
    critic->set_gpus(gpus);
    if (gpus >= 1) {
      CheckTrain(check, "critic", gpus, critic->mutable_train(), data.train_batch_size(), n,
                 derived);
    }
    check.Within("roles.critic.forward_max_token_len_per_gpu",
                 critic->forward_max_token_len_per_gpu(), 1, kMaxTokens);
  }

  const bool kl_used = kl_mode != nullptr && kl_mode->needs_reference;
  if (kl_used && !roles->has_reference()) {
    check.Fail("roles.reference",
               absl::StrCat("is required by algorithm.kl.mode ", Name(algorithm->kl().mode()),
                            " (the KL needs reference log-probs); add `reference: {gpus: 1}` or "
                            "set algorithm.kl.mode: none"));
  }
  if (!kl_used && roles->has_reference()) {
    check.Fail("roles.reference", "is unused with algorithm.kl.mode none; remove it");
  }
  if (roles->has_reference()) {
    auto* reference = roles->mutable_reference();
    int32_t gpus = reference->gpus();
    CompleteRoleGpus(check, "roles.reference.gpus", colocated, actor_gpus, 1, &gpus, derived);
    reference->set_gpus(gpus);
    check.Within("roles.reference.log_prob_micro_batch_size_per_gpu",
                 reference->log_prob_micro_batch_size_per_gpu(), 1, kMaxBatch);
    check.Within("roles.reference.log_prob_max_token_len_per_gpu",
                 reference->log_prob_max_token_len_per_gpu(), 1, kMaxTokens);
  }

  auto* reward = roles->mutable_reward();
  // A Python function is a kind of its own: as in verl, it replaces the rule reward, and a
  // reward model's or a service's scores would leave it unused.
  const int reward_kinds = !reward->rule().empty() + !reward->model().empty() +
                           !reward->remote().empty() + reward->has_custom_reward_function();
  // An SFT job scores only what its validation generates; without a reward it validates by the
  // loss on its validation conversations (algorithms::ValidatesByLoss).
  if (reward_kinds != 1 && !(reward_kinds == 0 && sft)) {
    check.Fail("roles.reward",
               reward_kinds == 0
                   ? "is required: give one of rule (e.g. gsm8k), model (a reward model "
                     "directory), remote (a scoring URL) or custom_reward_function (a Python "
                     "compute_score)"
                   : "give exactly one of rule, model, remote or custom_reward_function (a "
                     "Python function replaces the rule reward, as in verl)");
  }
  if (reward->has_custom_reward_function()) {
    CompletePythonReward(check, reward->mutable_custom_reward_function());
  }
  if (!reward->rule().empty() && !IsRewardRule(reward->rule())) {
    check.Fail("roles.reward.rule", absl::StrCat("'", reward->rule(), "' is not one of: ",
                                                 std::string(RewardRuleList())));
  }
  for (int i = 0; i < reward->val_rules_size(); ++i) {
    const std::string& rule = reward->val_rules(i);
    const std::string path = absl::StrCat("roles.reward.val_rules[", i, "]");
    if (!IsRewardRule(rule)) {
      check.Fail(path, absl::StrCat("'", rule, "' is not one of: ", std::string(RewardRuleList())));
    }
    for (int j = 0; j < i; ++j) {
      if (reward->val_rules(j) == rule) {
        check.Fail(path, absl::StrCat("'", rule, "' is named twice (also at [", j, "])"));
      }
    }
  }
  if (!reward->remote().empty() && !absl::StartsWith(reward->remote(), "http://") &&
      !absl::StartsWith(reward->remote(), "https://")) {
    check.Fail("roles.reward.remote", "must be an http:// or https:// URL");
  }
  check.Within("roles.reward.remote_timeout_s", reward->remote_timeout_s(), 1e-3, 3600);
  if (!reward->model().empty() && algorithms::NeedsGreedyBaseline(*algorithm)) {
    check.Fail("roles.reward.model",
               absl::StrCat(Name(estimator),
                            " scores each prompt's greedy baseline response on "
                            "the actor's workers, with roles.reward.rule, .custom_reward_function "
                            "or .remote; a reward model is not supported with it yet"));
  }
  if (!reward->model().empty()) {
    int32_t gpus = reward->gpus();
    CompleteRoleGpus(check, "roles.reward.gpus", colocated, actor_gpus, 1, &gpus, derived);
    reward->set_gpus(gpus);
  } else if (reward->gpus() != 0) {
    check.Fail("roles.reward.gpus", "only a reward model (roles.reward.model) uses GPUs; remove it");
  }

  // trainer
  auto* trainer_spec = spec->mutable_trainer();
  const auto& trainer = *trainer_spec;
  check.Within("trainer.total_steps", trainer.total_steps(), 0, kMaxSteps);
  check.Within("trainer.total_epochs", trainer.total_epochs(), 1, 1e6);
  check.Within("trainer.save_every", trainer.save_every(), -1, kMaxSteps);
  check.Within("trainer.val_every", trainer.val_every(), -1, kMaxSteps);
  check.Within("trainer.critic_warmup", trainer.critic_warmup(), 0, kMaxSteps);
  check.Within("trainer.max_restarts", trainer.max_restarts(), 0, 1000);
  check.Within("trainer.priority", trainer.priority(), -1000, 1000);
  if (trainer.max_ckpt_to_keep() < 0) {
    check.Fail("trainer.max_ckpt_to_keep",
               absl::StrCat(trainer.max_ckpt_to_keep(),
                            ": give the number of newest checkpoints to keep (>= 1), or 0 or "
                            "null to keep them all"));
  }
  check.Within("trainer.max_nonfinite_skips", trainer.max_nonfinite_skips(), 0, 1000000);
  check.Within("trainer.log_samples", trainer.log_samples(), 0, stages::kMaxLogSamples);
  check.Within("trainer.verify_weight_sync", trainer.verify_weight_sync(), 0, kMaxSteps);
  for (int i = 0; i < trainer.profile_steps_size(); ++i) {
    check.Within(absl::StrCat("trainer.profile_steps[", i, "]"), trainer.profile_steps(i), 1,
                 kMaxSteps);
  }
  if (trainer.profile_steps_size() > 0 && trainer.profile_dir().empty()) {
    check.Fail("trainer.profile_dir",
               "is required with trainer.profile_steps: the workers' directory for the traces");
  }
  if (trainer.device() != "auto" && trainer.device() != "cpu" && trainer.device() != "cuda") {
    check.Fail("trainer.device", absl::StrCat("'", trainer.device(), "' is not auto, cpu or cuda"));
  }
  if (trainer.critic_warmup() > 0 && !roles->has_critic()) {
    check.Fail("trainer.critic_warmup", "warms up a critic; this job has none (roles.critic)");
  }
  if (trainer.experiment_name().empty()) {
    trainer_spec->set_experiment_name(spec->name());
    Derived(derived, "trainer.experiment_name");
  }
  for (const auto& [path, value] : {std::pair{"trainer.project_name", trainer.project_name()},
                                    std::pair{"trainer.experiment_name",
                                              trainer.experiment_name()}}) {
    if (!IsValidJobName(value)) {
      check.Fail(path, "use 1-128 letters, digits, '.', '_' or '-' (it names log directories)");
    }
  }
  if (trainer.save_every() > 0 && trainer.checkpoint_dir().empty()) {
    check.Fail("trainer.checkpoint_dir",
               "is required when trainer.save_every is set: where should checkpoints go?");
  }
  if (trainer.async_save() && trainer.checkpoint_dir().empty()) {
    check.Fail("trainer.checkpoint_dir",
               "is required when trainer.async_save is set: where should checkpoints go?");
  }
  if (!trainer.checkpoint_uri().empty()) {
    if (const absl::StatusOr<S3Location> location = ParseS3Uri(trainer.checkpoint_uri());
        !location.ok()) {
      check.Fail("trainer.checkpoint_uri", std::string(location.status().message()));
    } else if (trainer.checkpoint_dir().empty()) {
      check.Fail("trainer.checkpoint_dir",
                 "is required when trainer.checkpoint_uri is set: the local copy the uploads "
                 "are made from");
    }
  }
  if (trainer.val_only() && data.val_files().empty()) {
    check.Fail("data.val_files", "is required when trainer.val_only is set (it validates only)");
  }
  if (trainer.val_every() > 0 && data.val_files().empty()) {
    check.Fail("data.val_files", "is required when trainer.val_every is set");
  }
  std::set<std::string> loggers;
  for (int i = 0; i < trainer.loggers_size(); ++i) {
    const std::string path = absl::StrCat("trainer.loggers[", i, "]");
    std::string logger = trainer.loggers(i);
    if (logger == "file") trainer_spec->set_loggers(i, logger = "jsonl");  // verl's name for it.
    if (logger == "wandb") {
      check.Fail(path, "wandb is not supported: it needs an account and network access; use "
                       "tensorboard (event files on disk) or jsonl");
    } else if (!Contains(kLoggers, logger)) {
      check.Fail(path, absl::StrCat("'", logger, "' is not one of: ", Join(kLoggers)));
    } else if (!loggers.insert(logger).second) {
      check.Fail(path, absl::StrCat("'", logger, "' is listed twice"));
    }
  }
}

}  // namespace rlhfd::config
