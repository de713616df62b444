// Lookups over the rule table.
#include "common/config/reward_rules.h"

#include <charconv>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/util/text.h"

namespace rlhfd::config {
namespace {

absl::string_view View(std::string_view text) { return {text.data(), text.size()}; }

bool MatchesSource(absl::string_view pattern, absl::string_view data_source) {
  if (absl::EndsWith(pattern, "*")) {
    return absl::StartsWith(data_source, pattern.substr(0, pattern.size() - 1));
  }
  return pattern == data_source;
}

}  // namespace

std::span<const RewardRuleInfo> RewardRules() { return kRewardRules; }

bool IsRewardRule(std::string_view name) {
  for (const RewardRuleInfo& rule : kRewardRules) {
    if (rule.name == name) return true;
  }
  return false;
}

std::string_view RewardRuleList() {
  static const std::string list =
      absl::StrJoin(kRewardRules, ", ", [](std::string* out, const RewardRuleInfo& rule) {
        out->append(rule.name.data(), rule.name.size());
      });
  return list;
}

std::string_view RuleForDataSource(std::string_view data_source) {
  for (const RewardRuleInfo& rule : kRewardRules) {
    for (absl::string_view pattern :
         absl::StrSplit(View(rule.data_sources), ", ", absl::SkipEmpty())) {
      if (MatchesSource(pattern, View(data_source))) return rule.name;
    }
  }
  return {};
}

std::string_view KnownDataSources() {
  static const std::string list = [] {
    std::string sources;
    for (const RewardRuleInfo& rule : kRewardRules) {
      if (rule.data_sources.empty()) continue;
      if (!sources.empty()) sources += ", ";
      sources.append(rule.data_sources.data(), rule.data_sources.size());
    }
    return sources;
  }();
  return list;
}

absl::StatusOr<std::string_view> RuleForRow(std::string_view rule, std::string_view data_source) {
  if (rule != kAutoRewardRule) return rule;
  const std::string_view picked = RuleForDataSource(data_source);
  if (picked.empty()) {
    for (const VerlSourceWithoutRule& source : kVerlSourcesWithoutRule) {
      for (absl::string_view pattern :
           absl::StrSplit(View(source.data_sources), ", ", absl::SkipEmpty())) {
        if (!MatchesSource(pattern, View(data_source))) continue;
        return absl::InvalidArgumentError(absl::StrCat(
            "data_source '", SanitizeForDisplay(View(data_source), 80),
            "' has no native reward rule under "
            "roles.reward.rule auto: ",
            View(source.why),
            ". Score it with a Python reward function (custom_reward_function) or a remote "
            "scoring service (roles.reward.remote)"));
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "data_source '", SanitizeForDisplay(View(data_source), 80),
        "' picks no reward rule under roles.reward.rule auto (known: ", View(KnownDataSources()),
        "); name a rule instead"));
  }
  return picked;
}

absl::StatusOr<GroundTruth> ReadGroundTruth(std::string_view rule, const nlohmann::json& truth) {
  const RewardRuleInfo* info = nullptr;
  for (const RewardRuleInfo& row : kRewardRules) {
    if (row.name == rule) info = &row;
  }
  if (info == nullptr || info->ground_truth == GroundTruthKind::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", SanitizeForDisplay(View(rule), 60), "' is not a rule that scores"));
  }
  GroundTruth read;
  switch (info->ground_truth) {
    case GroundTruthKind::kTextOrNumber:
      if (truth.is_string()) {
        read.text = truth.get<std::string>();
        return read;
      }
      if (truth.is_number()) {
        read.text = truth.dump();
        return read;
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "ground truth: the ", View(rule),
          " rule compares with text or a number, and the row has ", truth.type_name()));
    case GroundTruthKind::kNumber:
      if (truth.is_number()) {
        read.number = truth.get<double>();
        return read;
      }
      if (truth.is_string()) {
        const std::string& text = truth.get_ref<const std::string&>();
        const auto [end, error] =
            std::from_chars(text.data(), text.data() + text.size(), read.number);
        if (error == std::errc() && end == text.data() + text.size()) return read;
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "ground truth: the ", View(rule), " rule needs a number, and the row has ",
          truth.is_string()
              ? absl::StrCat("\"", SanitizeForDisplay(truth.get<std::string>(), 40), "\"")
              : std::string(truth.type_name())));
    case GroundTruthKind::kTargetAndNumbers: {
      const absl::Status shape = absl::InvalidArgumentError(
          absl::StrCat("ground truth: the ", View(rule),
                       " rule needs {\"target\": number, \"numbers\": [integers]}, and the row "
                       "has ",
                       truth.type_name()));
      if (!truth.is_object()) return shape;
      const auto target = truth.find("target");
      const auto numbers = truth.find("numbers");
      if (target == truth.end() || !target->is_number() || numbers == truth.end() ||
          !numbers->is_array()) {
        return shape;
      }
      read.number = target->get<double>();
      for (const nlohmann::json& number : *numbers) {
        if (!number.is_number_integer()) return shape;
        read.numbers.push_back(number.get<int64_t>());
      }
      return read;
    }
    case GroundTruthKind::kTargetTexts: {
      const absl::Status shape = absl::InvalidArgumentError(absl::StrCat(
          "ground truth: the ", View(rule),
          " rule needs {\"target\": text or [texts]}, and the row has ",
          truth.is_object() ? "an object without a text or a list of texts at \"target\""
                            : truth.type_name()));
      if (!truth.is_object()) return shape;
      const auto target = truth.find("target");
      if (target == truth.end()) return shape;
      if (target->is_string()) {
        read.texts.push_back(target->get<std::string>());
        return read;
      }
      if (!target->is_array()) return shape;
      for (const nlohmann::json& text : *target) {
        if (!text.is_string()) return shape;
        read.texts.push_back(text.get<std::string>());
      }
      return read;
    }
    case GroundTruthKind::kNone:
      break;
  }
  return absl::InternalError("unreachable");
}

}  // namespace rlhfd::config
