#include "common/config/reward_rules.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"

namespace rlhfd::config {
namespace {

constexpr RewardRuleInfo kRules[] = {
    {"gsm8k", "the number after the last \"#### \" in the response's last 300 characters equals "
              "the ground truth (verl's gsm8k, strict)"},
    {"math", "the last \\boxed{...} equals the ground truth after verl's LaTeX normalisation"},
    {"exact_match", "the response equals the ground truth, surrounding whitespace aside"},
    {"countdown", "<answer>equation</answer> uses each given number once and evaluates to the "
                  "target: 1; well-formed but wrong: 0.1 (verl's countdown)"},
    {"arithmetic", "the number the response starts with equals the ground truth: 1; another "
                   "number: 0.1 (the quickstart's task)"},
    {"auto", "the rule for each row's data_source, as verl's default reward chooses"},
};

}  // namespace

std::span<const RewardRuleInfo> RewardRules() { return kRules; }

bool IsRewardRule(std::string_view name) {
  for (const RewardRuleInfo& rule : kRules) {
    if (rule.name == name) return true;
  }
  return false;
}

std::string_view RewardRuleList() {
  static const std::string list = absl::StrJoin(
      kRules, ", ", [](std::string* out, const RewardRuleInfo& rule) {
        out->append(rule.name.data(), rule.name.size());
      });
  return list;
}

std::string_view RuleForDataSource(std::string_view data_source) {
  if (data_source == "openai/gsm8k") return "gsm8k";
  if (data_source == "lighteval/MATH" || data_source == "DigitalLearningGmbH/MATH-lighteval" ||
      data_source == "HuggingFaceH4/MATH-500") {
    return "math";
  }
  if (data_source == "countdown") return "countdown";
  if (data_source == "rlhfd/arithmetic") return "arithmetic";
  // deploy/prepare_data.py writes reasoning-gym problems in GSM8K's shape.
  if (absl::StartsWith(absl::string_view(data_source.data(), data_source.size()),
                       "reasoning_gym/")) {
    return "gsm8k";
  }
  return {};
}

}  // namespace rlhfd::config
