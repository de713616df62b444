#include "worker/reward/rule_reward.h"

#include <charconv>
#include <cstdint>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/config/reward_rules.h"
#include "common/util/text.h"
#include "worker/reward/countdown.h"
#include "worker/reward/gsm8k.h"
#include "worker/reward/math_answer.h"
#include "worker/reward/simple_rules.h"

namespace rlhfd::reward {
namespace {

using nlohmann::json;

absl::string_view View(std::string_view text) { return {text.data(), text.size()}; }

std::string KindOf(const json& value) { return value.type_name(); }

// A ground truth the text rules compare with: a string as it is, a number as JSON writes it.
absl::StatusOr<std::string> TextOf(const json& ground_truth, std::string_view rule) {
  if (ground_truth.is_string()) return ground_truth.get<std::string>();
  if (ground_truth.is_number()) return ground_truth.dump();
  return absl::InvalidArgumentError(
      absl::StrCat("ground truth: the ", View(rule), " rule compares with text or a number, and "
                   "the row has ", KindOf(ground_truth)));
}

absl::StatusOr<double> NumberOf(const json& ground_truth) {
  if (ground_truth.is_number()) return ground_truth.get<double>();
  if (ground_truth.is_string()) {
    const std::string& text = ground_truth.get_ref<const std::string&>();
    double value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error == std::errc() && end == text.data() + text.size()) return value;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "ground truth: the arithmetic rule needs a number, and the row has ",
      ground_truth.is_string() ? absl::StrCat("\"", SanitizeForDisplay(ground_truth.get<std::string>(), 40), "\"")
                               : KindOf(ground_truth)));
}

absl::StatusOr<double> ScoreCountdown(std::string_view response, const json& ground_truth) {
  const auto shape_error = [] {
    return absl::InvalidArgumentError(
        "ground truth: the countdown rule needs {\"target\": number, \"numbers\": [integers]}");
  };
  if (!ground_truth.is_object()) return shape_error();
  const auto target = ground_truth.find("target");
  const auto numbers = ground_truth.find("numbers");
  if (target == ground_truth.end() || !target->is_number() || numbers == ground_truth.end() ||
      !numbers->is_array()) {
    return shape_error();
  }
  std::vector<int64_t> available;
  for (const json& number : *numbers) {
    if (!number.is_number_integer()) return shape_error();
    available.push_back(number.get<int64_t>());
  }
  return CountdownScore(response, target->get<double>(), available);
}

template <double (*Compare)(std::string_view, std::string_view), const char* kName>
absl::StatusOr<double> ScoreAgainstText(std::string_view response, const json& ground_truth) {
  absl::StatusOr<std::string> truth = TextOf(ground_truth, kName);
  if (!truth.ok()) return truth.status();
  return Compare(response, *truth);
}

double Gsm8kStrict(std::string_view response, std::string_view truth) {
  return Gsm8kScore(response, truth);
}

absl::StatusOr<double> ScoreArithmetic(std::string_view response, const json& ground_truth) {
  absl::StatusOr<double> answer = NumberOf(ground_truth);
  if (!answer.ok()) return answer.status();
  return ArithmeticScore(response, *answer);
}

constexpr char kGsm8k[] = "gsm8k", kMath[] = "math", kExactMatch[] = "exact_match";

using RuleFunction = absl::StatusOr<double> (*)(std::string_view response,
                                                const json& ground_truth);
struct RegisteredRule {
  std::string_view name;
  RuleFunction score;
};

// The function of each row of config::kRewardRules but "auto", in the table's order.
constexpr RegisteredRule kRegistry[] = {
    {kGsm8k, ScoreAgainstText<Gsm8kStrict, kGsm8k>},
    {kMath, ScoreAgainstText<MathScore, kMath>},
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
    return absl::InvalidArgumentError(absl::StrCat("roles.reward.rule: '",
                                                   SanitizeForDisplay(View(rule), 60),
                                                   "' is not one of: ",
                                                   View(config::RewardRuleList())));
  }
  return RuleReward(std::string(rule));
}

absl::StatusOr<double> RuleReward::Score(std::string_view response, const json& ground_truth,
                                         std::string_view data_source) const {
  std::string_view rule = rule_;
  if (rule == config::kAutoRewardRule) {
    rule = config::RuleForDataSource(data_source);
    if (rule.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data_source '", SanitizeForDisplay(View(data_source), 80),
                       "' picks no reward rule under roles.reward.rule auto (known: ",
                       View(config::KnownDataSources()), "); name a rule instead"));
    }
  }
  for (const RegisteredRule& registered : kRegistry) {
    if (registered.name == rule) return registered.score(response, ground_truth);
  }
  return absl::InternalError(absl::StrCat("reward rule '", View(rule), "' is not implemented"));
}

}  // namespace rlhfd::reward
