// The rule rewards a config may name (roles.reward.rule): one table of what each rule is and
// which data sources verl's default reward scores with it, read by the config validator and by
// worker/reward, whose registry holds the rule functions and does not compile while a row has
// none. Adding a rule is a row here plus its function there.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace rlhfd::config {

struct RewardRuleInfo {
  std::string_view name;
  std::string_view summary;
  // The data_source values roles.reward.rule auto scores with this rule, ", "-separated; a
  // trailing '*' matches any source that starts with what precedes it.
  std::string_view data_sources;
};

// Every rule, "auto" (which scores nothing itself: it picks a row by data_source) last.
inline constexpr RewardRuleInfo kRewardRules[] = {
    {"gsm8k",
     "the number after the last \"#### \" in the response's last 300 characters equals the ground "
     "truth (verl's gsm8k, strict)",
     // deploy/prepare_data.py writes reasoning-gym problems in GSM8K's shape.
     "openai/gsm8k, reasoning_gym/*"},
    {"math", "the last \\boxed{...} equals the ground truth after verl's LaTeX normalisation",
     "lighteval/MATH, DigitalLearningGmbH/MATH-lighteval, HuggingFaceH4/MATH-500"},
    {"exact_match", "the response equals the ground truth, surrounding whitespace aside", ""},
    {"countdown",
     "<answer>equation</answer> uses each given number once and evaluates to the target: 1; "
     "well-formed but wrong: 0.1 (verl's countdown)",
     "countdown"},
    {"arithmetic",
     "the number the response starts with equals the ground truth: 1; another number: 0.1 (the "
     "quickstart's task)",
     "rlhfd/arithmetic"},
    {"auto", "the rule for each row's data_source, as verl's default reward chooses", ""},
};

// The rule name that picks a rule per row.
inline constexpr std::string_view kAutoRewardRule = "auto";

std::span<const RewardRuleInfo> RewardRules();

bool IsRewardRule(std::string_view name);

// "gsm8k, math, ..." for error messages.
std::string_view RewardRuleList();

// The rule "auto" scores a row of `data_source` with, as verl's default_compute_score chooses
// (openai/gsm8k, the MATH sets, countdown), plus rlhfd's own sources (reasoning_gym/*,
// rlhfd/arithmetic). Empty for a source no rule is known for.
std::string_view RuleForDataSource(std::string_view data_source);

// "openai/gsm8k, reasoning_gym/*, ..." for error messages.
std::string_view KnownDataSources();

}  // namespace rlhfd::config
