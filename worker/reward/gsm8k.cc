#include "worker/reward/gsm8k.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_replace.h"
#include "common/util/text.h"
#include "worker/reward/math_answer.h"

namespace rlhfd::reward {
namespace {

// verl matches on the last 300 characters only ("a safe approximation for 300 tokens").
constexpr size_t kClipCharacters = 300;

bool IsNumberCharacter(char c) { return (c >= '0' && c <= '9') || c == '.' || c == ','; }

// Length of the greedy match of -?[0-9.,]+ at `i` (0: none), as Python's re tries it: the
// optional '-' first, then without it.
size_t NumberMatchAt(std::string_view text, size_t i) {
  size_t start = i;
  if (start < text.size() && text[start] == '-') ++start;
  size_t end = start;
  while (end < text.size() && IsNumberCharacter(text[end])) ++end;
  if (end > start) return end - i;
  // With '-' taken nothing followed; without it the class must match at i itself, which it
  // cannot ('-' is not in the class).
  return 0;
}

// re.findall(pattern, text) for "#### (-?[0-9.,]+)" (prefixed) or "(-?[0-9.,]+)".
std::vector<std::string_view> FindNumbers(std::string_view text, std::string_view prefix) {
  std::vector<std::string_view> found;
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, prefix.size(), prefix) == 0) {
      const size_t length = NumberMatchAt(text, i + prefix.size());
      if (length > 0) {
        found.push_back(text.substr(i + prefix.size(), length));
        i += prefix.size() + length;
        continue;
      }
    }
    ++i;
  }
  return found;
}

}  // namespace

std::optional<std::string> ExtractGsm8kAnswer(std::string_view response, Gsm8kMethod method) {
  if (method == Gsm8kMethod::kBoxed) {
    // The whole response, as the math rule reads boxes: a box is written once, at the end.
    const std::optional<std::string> boxed = LastBoxedOnlyString(response);
    if (!boxed) return std::nullopt;
    const std::optional<std::string> inside = RemoveBoxed(*boxed);
    if (!inside) return std::nullopt;
    return std::string(absl::StripAsciiWhitespace(absl::StrReplaceAll(*inside, {{",", ""}})));
  }
  const absl::string_view clipped =
      LastCharacters(absl::string_view(response.data(), response.size()), kClipCharacters);
  const std::string_view text(clipped.data(), clipped.size());
  if (method == Gsm8kMethod::kStrict) {
    const std::vector<std::string_view> answers = FindNumbers(text, "#### ");
    if (answers.empty()) return std::nullopt;
    const std::string_view last = answers.back();
    return absl::StrReplaceAll(absl::string_view(last.data(), last.size()),
                               {{",", ""}, {"$", ""}});
  }
  const std::vector<std::string_view> answers = FindNumbers(text, "");
  if (answers.empty()) return std::nullopt;
  for (auto it = answers.rbegin(); it != answers.rend(); ++it) {
    if (*it != "" && *it != ".") return std::string(*it);
  }
  // Python's loop variable keeps the last value it took: the first match.
  return std::string(answers.front());
}

double Gsm8kScore(std::string_view response, std::string_view ground_truth, Gsm8kMethod method,
                  double format_score, double score) {
  const std::optional<std::string> answer = ExtractGsm8kAnswer(response, method);
  if (!answer) return 0.0;
  return *answer == ground_truth ? score : format_score;
}

}  // namespace rlhfd::reward
