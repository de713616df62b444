// The rule rewards a config may name (roles.reward.rule): one table of what each rule is and
// which data sources verl's default reward scores with it, read by the config validator and by
// worker/reward, whose registry holds the rule functions and does not compile while a row has
// none. Adding a rule is a row here plus its function there.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace rlhfd::config {

// What a rule reads of a row's ground truth.
enum class GroundTruthKind {
  kTextOrNumber,      // a string as it is, a number as JSON writes it
  kNumber,            // a number, or a string that is one
  kTargetAndNumbers,  // {"target": number, "numbers": [integers]} (countdown)
  kTargetTexts,       // {"target": text or [texts]} (Search-R1's question answering)
  kNone,              // "auto": the rule its row's data_source picks reads it
};

struct RewardRuleInfo {
  std::string_view name;
  std::string_view summary;
  GroundTruthKind ground_truth;
  // The data_source values roles.reward.rule auto scores with this rule, ", "-separated; a
  // trailing '*' matches any source that starts with what precedes it.
  std::string_view data_sources;
};

// Every rule, "auto" (which scores nothing itself: it picks a row by data_source) last.
inline constexpr RewardRuleInfo kRewardRules[] = {
    {"gsm8k",
     "the number after the last \"#### \" in the response's last 300 characters equals the ground "
     "truth (verl's gsm8k, strict)",
     GroundTruthKind::kTextOrNumber,
     // deploy/prepare_data.py writes reasoning-gym problems in GSM8K's shape.
     "openai/gsm8k, reasoning_gym/*"},
    // gsm8k's other answer formats: named in a config, never picked by auto, which keeps verl's
    // default (strict) for openai/gsm8k.
    {"gsm8k_flexible",
     "the last number in the response's last 300 characters equals the ground truth as text "
     "(verl's gsm8k, flexible)",
     GroundTruthKind::kTextOrNumber, ""},
    {"gsm8k_boxed",
     "the inside of the response's last \\boxed{...}, commas and surrounding whitespace removed, "
     "equals the ground truth as text (rlhfd's; verl's gsm8k has no boxed format)",
     GroundTruthKind::kTextOrNumber, ""},
    {"math", "the last \\boxed{...} equals the ground truth after verl's LaTeX normalisation",
     GroundTruthKind::kTextOrNumber,
     "lighteval/MATH, DigitalLearningGmbH/MATH-lighteval, HuggingFaceH4/MATH-500"},
    {"math_dapo",
     "the last \"Answer: ...\" line of the response's last 300 characters equals the ground truth "
     "after verl's normalize_final_answer (without one, the last \\boxed{...} of the last 100 "
     "characters equals it as written): 1, else -1 (verl's math_dapo)",
     GroundTruthKind::kTextOrNumber, "math_dapo, math, math_dapo_reasoning, aime*"},
    {"search_r1_qa_em",
     "the last <answer>...</answer> equals one of the ground truth's targets after SQuAD's "
     "normalisation: 1 (0.25 with over 10 answer tags), else 0 (verl's search_r1_like_qa_em)",
     GroundTruthKind::kTargetTexts,
     "searchR1_nq, searchR1_triviaqa, searchR1_popqa, searchR1_hotpotqa, searchR1_2wikimultihopqa, "
     "searchR1_musique, searchR1_bamboogle"},
    {"exact_match", "the response equals the ground truth, surrounding whitespace aside",
     GroundTruthKind::kTextOrNumber, ""},
    {"countdown",
     "<answer>equation</answer> uses each given number once and evaluates to the target: 1; "
     "well-formed but wrong: 0.1 (verl's countdown)",
     GroundTruthKind::kTargetAndNumbers, "countdown"},
    {"arithmetic",
     "the number the response starts with equals the ground truth: 1; another number: 0.1 (the "
     "quickstart's task)",
     GroundTruthKind::kNumber, "rlhfd/arithmetic"},
    {"auto", "the rule for each row's data_source, as verl's default reward chooses",
     GroundTruthKind::kNone, ""},
};

// The data sources verl's default_compute_score scores that no rule here reproduces, and why:
// "auto" refuses them at submission, pointing to the ways rlhfd can score them.
struct VerlSourceWithoutRule {
  std::string_view data_sources;  // ", "-separated, as in RewardRuleInfo
  std::string_view why;
};
inline constexpr VerlSourceWithoutRule kVerlSourcesWithoutRule[] = {
    {"numina_aops_forum, numina_synthetic_math, numina_amc_aime, numina_synthetic_amc, "
     "numina_cn_k12, numina_olympiads",
     "verl scores it with prime_math, which needs the sympy and pylatexenc packages"},
    {"hiyouga/geometry3k",
     "verl scores it with geo3k, which needs the mathruler package (and sympy through it)"},
    {"codecontests, apps, codeforces, taco",
     "verl scores it by running the response's code (prime_code, or a sandbox_fusion service)"},
};

// The rule name that picks a rule per row.
inline constexpr std::string_view kAutoRewardRule = "auto";

std::span<const RewardRuleInfo> RewardRules();

bool IsRewardRule(std::string_view name);

// "gsm8k, math, ..." for error messages.
std::string_view RewardRuleList();

// The rule "auto" scores a row of `data_source` with, as verl's default_compute_score chooses
// (openai/gsm8k, the MATH sets, DAPO's math and AIME sets, Search-R1's QA sets), plus countdown
// and rlhfd's own sources (reasoning_gym/*, rlhfd/arithmetic). Empty for a source no rule is
// known for.
std::string_view RuleForDataSource(std::string_view data_source);

// "openai/gsm8k, reasoning_gym/*, ..." for error messages.
std::string_view KnownDataSources();

// A row's ground truth as rule `rule` (not "auto") reads it: the text rules' text, the arithmetic
// rule's number, countdown's target and numbers, or search_r1_qa_em's target texts.
// INVALID_ARGUMENT naming the rule and what it needs when `truth` is not of the rule's kind: the
// worker scores with it, and submission checks a data file's first rows with it, so both refuse the
// same rows.
struct GroundTruth {
  std::string text;                // kTextOrNumber
  std::vector<std::string> texts;  // kTargetTexts
  double number = 0;               // kNumber; kTargetAndNumbers: the target
  std::vector<int64_t> numbers;    // kTargetAndNumbers
};
absl::StatusOr<GroundTruth> ReadGroundTruth(std::string_view rule, const nlohmann::json& truth);

// The rule a row of `data_source` is scored with under roles.reward.rule `rule`: `rule` itself,
// or for "auto" RuleForDataSource's; INVALID_ARGUMENT naming the source and the known ones when
// "auto" has none for it (saying why and what to use instead for a source of
// kVerlSourcesWithoutRule).
absl::StatusOr<std::string_view> RuleForRow(std::string_view rule, std::string_view data_source);

}  // namespace rlhfd::config
