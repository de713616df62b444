// Scores JSON lines from stdin with rlhfd's rule rewards, one JSON line out per line in:
//   {"rule": "gsm8k", "response": "...", "ground_truth": ..., "data_source": "..."}
//   -> {"score": 1.0} or {"error": "..."}
// Every rule, "gsm8k_flexible" too, through the registry the worker scores with (RuleReward), so
// what verl_parity.py compares with verl is what a job runs.
#include <iostream>
#include <string>

#include "nlohmann/json.hpp"
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
      absl::StatusOr<rlhfd::reward::RuleReward> reward = rlhfd::reward::RuleReward::Make(rule);
      absl::StatusOr<double> score = reward.ok()
                                         ? reward->Score(response, row.at("ground_truth"), source)
                                         : absl::StatusOr<double>(reward.status());
      if (score.ok()) {
        out["score"] = *score;
      } else {
        out["error"] = std::string(score.status().message());
      }
    } catch (const std::exception& e) {
      out["error"] = e.what();
    }
    std::cout << out.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
  }
  return 0;
}
