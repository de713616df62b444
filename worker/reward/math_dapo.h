// verl's DAPO math reward (verl 0.9.1's verl/utils/reward_score/math_dapo.py) as verl's
// default_compute_score calls it: in the response's last 300 characters, the last
// "Answer: ..." line (Minerva's format) after normalize_final_answer equals the normalised ground
// truth; without one, the last \boxed{...} of the last 100 characters equals the ground truth as
// it is. 1 when correct, -1 when not (the "score" of verl's {score, acc, pred}).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace rlhfd::reward {

// What re.findall(r"(?i)Answer\s*:\s*([^\n]+)", text) finds last, or nullopt when it finds none.
std::optional<std::string> LastMinervaAnswer(std::string_view text);

// normalize_final_answer.
std::string NormalizeDapoAnswer(std::string_view answer);

double MathDapoScore(std::string_view response, std::string_view ground_truth);

}  // namespace rlhfd::reward
