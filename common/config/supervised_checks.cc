#include "common/config/supervised_checks.h"

#include <string>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace rlhfd::config {

void CheckSupervised(Checker& check, const v1::JobSpec& spec) {
  const v1::RolesSpec& roles = spec.roles();
  constexpr absl::string_view kWhy = " (trainer.mode sft trains on the data's conversations)";
  const auto bad_path = [](const std::string& key) {
    return absl::StrContains(key, "..") || absl::StartsWith(key, ".") || absl::EndsWith(key, ".");
  };
  const std::string& key = spec.data().messages_key();
  if (bad_path(spec.data().response_key())) {
    check.Fail("data.response_key",
               absl::StrCat("'", spec.data().response_key(),
                            "': the key (or dotted path) of each single-turn training line's "
                            "response, or '' for conversations under data.messages_key"));
  } else if (!spec.data().response_key().empty()) {
    // Single-turn rows: the prompt under data.prompt_key (a bad path finds no prompt when the
    // data is read, naming the key).
  } else if (key.empty() || bad_path(key)) {
    check.Fail("data.messages_key",
               absl::StrCat("'", key,
                            "': trainer.mode sft needs the key (or dotted path) of each "
                            "training line's conversation"));
  }
  for (const auto& [field, value, what] :
       {std::tuple("data.tools_key", spec.data().tools_key(), "tool schemas"),
        std::tuple("data.enable_thinking_key", spec.data().enable_thinking_key(),
                   "enable_thinking")}) {
    if (bad_path(value)) {
      check.Fail(field,
                 absl::StrCat("'", value, "': the key (or dotted path) of each training line's ",
                              what, ", or '' for none"));
    }
  }
  if (roles.actor().rollout().n() != 1) {
    check.Fail(
        "roles.actor.rollout.n",
        absl::StrCat(roles.actor().rollout().n(),
                     ": a supervised step trains one row per conversation; set n to 1", kWhy));
  }
  if (roles.actor().rollout().tp() > 1) {
    check.Fail("roles.actor.rollout.tp",
               absl::StrCat(roles.actor().rollout().tp(),
                            ": supervised steps lay their rows out at rollout tp 1 for now", kWhy));
  }
  if (roles.has_critic()) check.Fail("roles.critic", absl::StrCat("is unused; remove it", kWhy));
  if (spec.algorithm().kl().mode() != v1::KL_MODE_NONE) {
    check.Fail("algorithm.kl.mode",
               absl::StrCat("a supervised step has no KL term: set it to none", kWhy));
  }
  if (roles.has_rollout()) {
    check.Fail("roles.rollout",
               absl::StrCat("a rollout pool generates for RL steps; remove it", kWhy));
  }
  if (spec.trainer().critic_warmup() > 0) {
    check.Fail("trainer.critic_warmup", absl::StrCat("is unused; remove it", kWhy));
  }
  if (!roles.reward().model().empty()) {
    check.Fail("roles.reward.model",
               absl::StrCat("a reward model pool is not run by supervised steps; score the "
                            "validation with a rule, remote or custom_reward_function",
                            kWhy));
  }
  const v1::AlgorithmSpec& algorithm = spec.algorithm();
  if (algorithm.entropy_coeff() != 0) {
    check.Fail("algorithm.entropy_coeff",
               absl::StrCat("a supervised step has no entropy bonus: set it to 0", kWhy));
  }
  if (!algorithm.rollout_correction().rollout_is().empty() ||
      algorithm.rollout_correction().bypass_mode()) {
    check.Fail("algorithm.rollout_correction",
               absl::StrCat("corrects for a rollout's policy, and a supervised step has no "
                            "rollout: remove it",
                            kWhy));
  }
}

}  // namespace rlhfd::config
