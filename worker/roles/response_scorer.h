// Rule, Python-function and remote rewards of decoded responses, computed where the responses
// are (the actor ranks): the reward role's work when it has no model of its own.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "worker/reward/python_reward.h"
#include "worker/reward/remote_reward.h"
#include "worker/reward/rule_reward.h"

namespace rlhfd::roles {

struct ScoredResponse {
  std::string prompt_text;
  std::string response_text;
  std::string ground_truth_json;  // "" when the row has none
  std::string data_source;
  std::string extra_info_json;  // "" when the row has none
};

class ResponseScorer {
 public:
  // For roles.reward.rule, .custom_reward_function or .remote; null for a reward model (which
  // scores on its own pool). A Python function's pool starts here: its import errors come back.
  static absl::StatusOr<std::unique_ptr<ResponseScorer>> Create(const v1::RewardSpec& spec);

  // One score per response. INVALID_ARGUMENT names the row (`first_row` + its position) whose
  // ground truth or extra_info is not JSON or not what the rule reads; the Python and remote
  // rewards' errors as they are.
  absl::StatusOr<std::vector<double>> Score(const std::vector<ScoredResponse>& responses,
                                            int64_t first_row,
                                            const std::atomic<bool>* cancelled) const;

  // Each roles.reward.val_rules rule's score of every response, in the config's order; errors as
  // Score's.
  absl::StatusOr<std::vector<std::pair<std::string, std::vector<double>>>> ScoreWithValRules(
      const std::vector<ScoredResponse>& responses, int64_t first_row) const;

 private:
  std::optional<reward::RuleReward> rule_;
  std::vector<reward::RuleReward> val_rules_;
  std::unique_ptr<reward::RemoteReward> remote_;
  std::unique_ptr<reward::PythonReward> python_;
};

}  // namespace rlhfd::roles
