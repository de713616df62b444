// The two rules that are not verl's: exact_match, and arithmetic, the quickstart's task (a short
// sum whose answer the model gives first).
#pragma once

#include <optional>
#include <string_view>

namespace rlhfd::reward {

// 1 when the response equals the ground truth once whitespace at both ends is removed, else 0.
double ExactMatchScore(std::string_view response, std::string_view ground_truth);

// The number the response starts with (after whitespace): -?digits[.digits], commas between
// digit groups ignored; nullopt when it does not start with one.
std::optional<double> LeadingNumber(std::string_view response);

// `score` when the leading number is within 1e-6 of `answer`, `format_score` for another number,
// 0 when the response does not start with a number.
double ArithmeticScore(std::string_view response, double answer, double format_score = 0.1,
                       double score = 1.0);

}  // namespace rlhfd::reward
