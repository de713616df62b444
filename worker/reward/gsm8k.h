// verl's gsm8k reward (verl/utils/reward_score/gsm8k.py), character for character: the answer is
// read from the response's last 300 characters, either after the last "#### " (strict: verl's
// default, and what rlhfd's "gsm8k" rule uses) or as the last number (flexible), and compared
// with the ground truth as text.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace rlhfd::reward {

enum class Gsm8kMethod { kStrict, kFlexible };

// The answer verl's extract_solution finds, or nullopt when it finds none. Strict strips ',' and
// '$'; flexible returns the last match of -?[0-9.,]+ that is not "" or "." as it stands.
std::optional<std::string> ExtractGsm8kAnswer(std::string_view response,
                                              Gsm8kMethod method = Gsm8kMethod::kStrict);

// `score` when the answer equals `ground_truth`, `format_score` when another answer was found,
// 0 when none was.
double Gsm8kScore(std::string_view response, std::string_view ground_truth,
                  Gsm8kMethod method = Gsm8kMethod::kStrict, double format_score = 0.0,
                  double score = 1.0);

}  // namespace rlhfd::reward
