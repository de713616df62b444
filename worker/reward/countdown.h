// verl's countdown reward (verl/utils/reward_score/countdown.py, from TinyZero): the last
// <answer>...</answer> on the response's last line is an equation that must use each of the given
// numbers exactly once and evaluate to the target.
//
// One difference: verl's version looks for the assistant header ("Assistant:" or
// "<|im_start|>assistant") and scores 0 without one, because TinyZero scored prompt and response
// together; verl's reward managers pass the response alone, which never has it. Here the text
// after such a header is used when there is one, else the whole response.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rlhfd::reward {

// The equation inside the last <answer>...</answer> of the response's last line.
std::optional<std::string> ExtractCountdownEquation(std::string_view response);

// `score` when the equation uses exactly `numbers` and evaluates within 1e-5 of `target`,
// `format_score` for another equation, 0 when there is none.
double CountdownScore(std::string_view response, double target,
                      const std::vector<int64_t>& numbers, double format_score = 0.1,
                      double score = 1.0);

}  // namespace rlhfd::reward
