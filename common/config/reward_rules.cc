// Lookups over the rule table.
#include "common/config/reward_rules.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

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

}  // namespace rlhfd::config
