// Rule rewards by the names configs use (common/config/reward_rules.h's table, which also says
// which data sources "auto" scores with each): a response, its row's ground truth (a JSON value,
// as the data file holds it) and data_source in, a score out.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace rlhfd::reward {

class RuleReward {
 public:
  // INVALID_ARGUMENT for a name that is not in the table.
  static absl::StatusOr<RuleReward> Make(std::string_view rule);

  // INVALID_ARGUMENT naming what the row lacks: a ground truth of the shape the rule reads
  // (text or a number; countdown's {"target", "numbers"}), or under "auto" a data_source that
  // picks a rule.
  absl::StatusOr<double> Score(std::string_view response, const nlohmann::json& ground_truth,
                               std::string_view data_source) const;

  const std::string& rule() const { return rule_; }

 private:
  explicit RuleReward(std::string rule) : rule_(std::move(rule)) {}

  std::string rule_;
};

// The rules implemented here: every name of the table except "auto".
std::vector<std::string_view> ImplementedRules();

}  // namespace rlhfd::reward
