// Rule and remote rewards of decoded responses, computed where the responses are (the actor
// ranks): the reward role's work when it has no model of its own.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "worker/reward/remote_reward.h"
#include "worker/reward/rule_reward.h"

namespace rlhfd::roles {

struct ScoredResponse {
  std::string prompt_text;
  std::string response_text;
  std::string ground_truth_json;  // "" when the row has none
  std::string data_source;
};

class ResponseScorer {
 public:
  // For roles.reward.rule or .remote; null for a reward model (which scores on its own pool).
  static absl::StatusOr<std::unique_ptr<ResponseScorer>> Create(const v1::RewardSpec& spec);

  // One score per response. INVALID_ARGUMENT names the row (`first_row` + its position) whose
  // ground truth is not JSON or not what the rule reads; the remote reward's errors as they are.
  absl::StatusOr<std::vector<double>> Score(const std::vector<ScoredResponse>& responses,
                                            int64_t first_row,
                                            const std::atomic<bool>* cancelled) const;

 private:
  std::optional<reward::RuleReward> rule_;
  std::unique_ptr<reward::RemoteReward> remote_;
};

}  // namespace rlhfd::roles
