#include "worker/reward/countdown.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "absl/strings/ascii.h"
#include "worker/reward/expression.h"

namespace rlhfd::reward {
namespace {

// The integers of re.findall(r"\d+", text).
std::optional<std::vector<int64_t>> NumbersIn(std::string_view text) {
  std::vector<int64_t> numbers;
  for (size_t i = 0; i < text.size();) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[end]))) ++end;
    int64_t value = 0;
    const auto [last, error] = std::from_chars(text.data() + i, text.data() + end, value);
    // A number past int64 cannot be one of the given numbers.
    if (error != std::errc()) return std::nullopt;
    numbers.push_back(value);
    i = end;
  }
  return numbers;
}

}  // namespace

std::optional<std::string> ExtractCountdownEquation(std::string_view response) {
  for (std::string_view header : {"Assistant:", "<|im_start|>assistant"}) {
    const size_t at = response.find(header);
    if (at != std::string_view::npos) {
      response = response.substr(at + header.size());
      break;
    }
  }
  const size_t newline = response.rfind('\n');
  if (newline != std::string_view::npos) response = response.substr(newline + 1);
  // re.finditer(r"<answer>(.*?)</answer>") and the last match: non-overlapping from the left.
  std::optional<std::string_view> last;
  constexpr std::string_view kOpen = "<answer>", kClose = "</answer>";
  for (size_t i = response.find(kOpen); i != std::string_view::npos;) {
    const size_t close = response.find(kClose, i + kOpen.size());
    if (close == std::string_view::npos) break;
    last = response.substr(i + kOpen.size(), close - i - kOpen.size());
    i = response.find(kOpen, close + kClose.size());
  }
  if (!last) return std::nullopt;
  // Python's str.strip(): whitespace at both ends.
  return std::string(absl::StripAsciiWhitespace(absl::string_view(last->data(), last->size())));
}

double CountdownScore(std::string_view response, double target,
                      const std::vector<int64_t>& numbers, double format_score, double score) {
  const std::optional<std::string> equation = ExtractCountdownEquation(response);
  if (!equation) return 0.0;
  std::optional<std::vector<int64_t>> used = NumbersIn(*equation);
  if (!used) return format_score;
  std::vector<int64_t> available = numbers;
  std::sort(used->begin(), used->end());
  std::sort(available.begin(), available.end());
  if (*used != available) return format_score;
  const std::optional<double> result = EvaluateArithmetic(*equation);
  if (!result) return format_score;
  return std::abs(*result - target) < 1e-5 ? score : format_score;
}

}  // namespace rlhfd::reward
