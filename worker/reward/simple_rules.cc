#include "worker/reward/simple_rules.h"

#include <charconv>
#include <cmath>
#include <string>

#include "absl/strings/ascii.h"

namespace rlhfd::reward {
namespace {

absl::string_view View(std::string_view text) { return {text.data(), text.size()}; }

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

double ExactMatchScore(std::string_view response, std::string_view ground_truth) {
  return absl::StripAsciiWhitespace(View(response)) == absl::StripAsciiWhitespace(View(ground_truth))
             ? 1.0
             : 0.0;
}

std::optional<double> LeadingNumber(std::string_view response) {
  const absl::string_view text = absl::StripLeadingAsciiWhitespace(View(response));
  std::string digits;
  size_t i = 0;
  if (i < text.size() && text[i] == '-') digits += text[i++];
  const size_t first_digit = digits.size();
  for (; i < text.size(); ++i) {
    if (IsDigit(text[i])) {
      digits += text[i];
    } else if (text[i] == ',' && digits.size() > first_digit && i + 1 < text.size() &&
               IsDigit(text[i + 1])) {
      continue;  // 1,000
    } else {
      break;
    }
  }
  if (digits.size() == first_digit) return std::nullopt;
  if (i + 1 < text.size() && text[i] == '.' && IsDigit(text[i + 1])) {
    digits += text[i++];
    while (i < text.size() && IsDigit(text[i])) digits += text[i++];
  }
  double value = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (error != std::errc()) return std::nullopt;
  return value;
}

double ArithmeticScore(std::string_view response, double answer, double format_score,
                       double score) {
  const std::optional<double> number = LeadingNumber(response);
  if (!number) return 0.0;
  return std::abs(*number - answer) <= 1e-6 ? score : format_score;
}

}  // namespace rlhfd::reward
