// Scores JSON lines from stdin with rlhfd's rule rewards, one JSON line out per line in:
//   {"rule": "gsm8k", "response": "...", "ground_truth": ..., "data_source": "..."}
//   -> {"score": 1.0} or {"error": "..."}
// "gsm8k_flexible" scores with gsm8k's flexible extraction. verl_parity.py drives it.
#include <iostream>
#include <string>

#include "nlohmann/json.hpp"
#include "worker/reward/gsm8k.h"
#include "worker/reward/rule_reward.h"

int main() {
  using nlohmann::json;
  std::string line;
  while (std::getline(std::cin, line)) {
    json out;
    try {
      const json row = json::parse(line);
      const std::string rule = row.at("rule").get<std::string>();
      const std::string response = row.at("response").get<std::string>();
      const std::string source = row.value("data_source", "");
      if (rule == "gsm8k_flexible") {
        out["score"] = rlhfd::reward::Gsm8kScore(response, row.at("ground_truth").get<std::string>(),
                                                 rlhfd::reward::Gsm8kMethod::kFlexible);
      } else {
        absl::StatusOr<rlhfd::reward::RuleReward> reward = rlhfd::reward::RuleReward::Make(rule);
        absl::StatusOr<double> score =
            reward.ok() ? reward->Score(response, row.at("ground_truth"), source)
                        : absl::StatusOr<double>(reward.status());
        if (score.ok()) {
          out["score"] = *score;
        } else {
          out["error"] = std::string(score.status().message());
        }
      }
    } catch (const std::exception& e) {
      out["error"] = e.what();
    }
    std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
  }
  return 0;
}
