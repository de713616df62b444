#include "worker/reward/rule_reward.h"

#include <cstdint>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/config/reward_rules.h"
#include "common/util/text.h"
#include "worker/reward/countdown.h"
#include "worker/reward/gsm8k.h"
#include "worker/reward/math_answer.h"
#include "worker/reward/math_dapo.h"
#include "worker/reward/search_r1_qa.h"
#include "worker/reward/simple_rules.h"

namespace rlhfd::reward {
namespace {

using nlohmann::json;

absl::string_view View(std::string_view text) { return {text.data(), text.size()}; }

// The ground truth as the table says `rule` reads it (config::ReadGroundTruth: submission checks
// data files' first rows with the same function).
template <double (*Compare)(std::string_view, std::string_view), const char* kName>
absl::StatusOr<double> ScoreAgainstText(std::string_view response, const json& ground_truth) {
  absl::StatusOr<config::GroundTruth> truth = config::ReadGroundTruth(kName, ground_truth);
  if (!truth.ok()) return truth.status();
  return Compare(response, truth->text);
}

double Gsm8kStrict(std::string_view response, std::string_view truth) {
  return Gsm8kScore(response, truth);
}

double Gsm8kFlexible(std::string_view response, std::string_view truth) {
  return Gsm8kScore(response, truth, Gsm8kMethod::kFlexible);
}

double Gsm8kBoxed(std::string_view response, std::string_view truth) {
  return Gsm8kScore(response, truth, Gsm8kMethod::kBoxed);
}

absl::StatusOr<double> ScoreArithmetic(std::string_view response, const json& ground_truth) {
  absl::StatusOr<config::GroundTruth> truth = config::ReadGroundTruth("arithmetic", ground_truth);
  if (!truth.ok()) return truth.status();
  return ArithmeticScore(response, truth->number);
}

absl::StatusOr<double> ScoreCountdown(std::string_view response, const json& ground_truth) {
  absl::StatusOr<config::GroundTruth> truth = config::ReadGroundTruth("countdown", ground_truth);
  if (!truth.ok()) return truth.status();
  return CountdownScore(response, truth->number, truth->numbers);
}

absl::StatusOr<double> ScoreSearchR1Qa(std::string_view response, const json& ground_truth) {
  absl::StatusOr<config::GroundTruth> truth =
      config::ReadGroundTruth("search_r1_qa_em", ground_truth);
  if (!truth.ok()) return truth.status();
  return SearchR1QaScore(response, truth->texts);
}

constexpr char kGsm8k[] = "gsm8k", kGsm8kFlexible[] = "gsm8k_flexible",
               kGsm8kBoxed[] = "gsm8k_boxed", kMath[] = "math", kMathDapo[] = "math_dapo",
               kExactMatch[] = "exact_match";

using RuleFunction = absl::StatusOr<double> (*)(std::string_view response,
                                                const json& ground_truth);
struct RegisteredRule {
  std::string_view name;
  RuleFunction score;
};

// The function of each row of config::kRewardRules but "auto", in the table's order.
constexpr RegisteredRule kRegistry[] = {
    {kGsm8k, ScoreAgainstText<Gsm8kStrict, kGsm8k>},
    {kGsm8kFlexible, ScoreAgainstText<Gsm8kFlexible, kGsm8kFlexible>},
    {kGsm8kBoxed, ScoreAgainstText<Gsm8kBoxed, kGsm8kBoxed>},
    {kMath, ScoreAgainstText<MathScore, kMath>},
    {kMathDapo, ScoreAgainstText<MathDapoScore, kMathDapo>},
    {"search_r1_qa_em", ScoreSearchR1Qa},
    {kExactMatch, ScoreAgainstText<ExactMatchScore, kExactMatch>},
    {"countdown", ScoreCountdown},
    {"arithmetic", ScoreArithmetic},
};

constexpr bool RegistryFollowsTheTable() {
  size_t next = 0;
  for (const config::RewardRuleInfo& rule : config::kRewardRules) {
    if (rule.name == config::kAutoRewardRule) continue;
    if (next == std::size(kRegistry) || kRegistry[next].name != rule.name) return false;
    ++next;
  }
  return next == std::size(kRegistry);
}
static_assert(RegistryFollowsTheTable(),
              "each rule of config::kRewardRules but auto needs its function in kRegistry, in "
              "the table's order");

}  // namespace

std::vector<std::string_view> ImplementedRules() {
  std::vector<std::string_view> names;
  for (const RegisteredRule& rule : kRegistry) names.push_back(rule.name);
  return names;
}

absl::StatusOr<RuleReward> RuleReward::Make(std::string_view rule) {
  if (!config::IsRewardRule(rule)) {
    return absl::InvalidArgumentError(
        absl::StrCat("roles.reward.rule: '", SanitizeForDisplay(View(rule), 60),
                     "' is not one of: ", View(config::RewardRuleList())));
  }
  return RuleReward(std::string(rule));
}

absl::StatusOr<double> RuleReward::Score(std::string_view response, const json& ground_truth,
                                         std::string_view data_source) const {
  absl::StatusOr<std::string_view> rule = config::RuleForRow(rule_, data_source);
  if (!rule.ok()) return rule.status();
  for (const RegisteredRule& registered : kRegistry) {
    if (registered.name == *rule) return registered.score(response, ground_truth);
  }
  return absl::InternalError(absl::StrCat("reward rule '", View(*rule), "' is not implemented"));
}

}  // namespace rlhfd::reward
