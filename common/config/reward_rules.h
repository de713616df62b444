// The rule rewards a config may name (roles.reward.rule): one table, read by the config validator
// and implemented by worker/reward, whose registry is checked against it.
#pragma once

#include <span>
#include <string_view>

namespace rlhfd::config {

struct RewardRuleInfo {
  std::string_view name;
  std::string_view summary;
};

// Every rule name, "auto" last.
std::span<const RewardRuleInfo> RewardRules();

bool IsRewardRule(std::string_view name);

// "gsm8k, math, ..." for error messages.
std::string_view RewardRuleList();

// The rule "auto" scores a row of `data_source` with, as verl's default_compute_score chooses
// (openai/gsm8k, the MATH sets, countdown), plus rlhfd's own sources (reasoning_gym/*,
// rlhfd/arithmetic). Empty for a source no rule is known for.
std::string_view RuleForDataSource(std::string_view data_source);

}  // namespace rlhfd::config
