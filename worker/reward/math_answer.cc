#include "worker/reward/math_answer.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/util/text.h"

namespace rlhfd::reward {
namespace {

absl::string_view View(std::string_view text) { return {text.data(), text.size()}; }

std::vector<std::string> Split(std::string_view text, std::string_view separator) {
  return std::vector<std::string>(absl::StrSplit(View(text), View(separator)));
}

bool Contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

std::string ReplaceAll(std::string text, std::string_view from, std::string_view to) {
  return absl::StrReplaceAll(text, {{View(from), View(to)}});
}

// The first character of `text` (Python's text[0]) and the rest (text[1:]).
std::string_view FirstCharacter(std::string_view text) {
  return text.substr(0, CharacterBytesAt(View(text), 0));
}

std::optional<std::string> FixFracs(const std::string& text) {
  const std::vector<std::string> parts = Split(text, "\\frac");
  std::string fixed = parts[0];
  for (size_t k = 1; k < parts.size(); ++k) {
    const std::string_view part = parts[k];
    fixed += "\\frac";
    if (part.empty()) return std::nullopt;  // substr[0] raises IndexError
    if (part[0] == '{') {
      fixed += part;
      continue;
    }
    if (CountCharacters(View(part)) < 2) return text;
    const std::string_view a = FirstCharacter(part);
    const std::string_view rest = part.substr(a.size());
    const std::string_view b = FirstCharacter(rest);
    const std::string_view tail = rest.substr(b.size());
    if (b != "{") {
      absl::StrAppend(&fixed, "{", View(a), "}{", View(b), "}", View(tail));
    } else {
      absl::StrAppend(&fixed, "{", View(a), "}", View(b), View(tail));
    }
  }
  return fixed;
}

// Python's str(int(s)) == s: an optional '-' and digits without a leading zero ("0" itself).
bool IsCanonicalInteger(std::string_view text) {
  const bool negative = !text.empty() && text[0] == '-';
  if (negative) text.remove_prefix(1);
  if (text.empty()) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  if (text.size() > 1 && text[0] == '0') return false;
  return !(negative && text == "0");  // str(int("-0")) is "0"
}

std::string FixASlashB(const std::string& text) {
  const std::vector<std::string> parts = Split(text, "/");
  if (parts.size() != 2) return text;
  if (!IsCanonicalInteger(parts[0]) || !IsCanonicalInteger(parts[1])) return text;
  return absl::StrCat("\\frac{", parts[0], "}{", parts[1], "}");
}

std::optional<std::string> RemoveRightUnits(const std::string& text) {
  if (!Contains(text, "\\text{ ")) return text;
  const std::vector<std::string> parts = Split(text, "\\text{ ");
  if (parts.size() != 2) return std::nullopt;  // assert len(splits) == 2
  return parts[0];
}

std::optional<std::string> FixSqrt(const std::string& text) {
  if (!Contains(text, "\\sqrt")) return text;
  const std::vector<std::string> parts = Split(text, "\\sqrt");
  std::string fixed = parts[0];
  for (size_t k = 1; k < parts.size(); ++k) {
    const std::string_view part = parts[k];
    if (part.empty()) return std::nullopt;  // split[0] raises IndexError
    if (part[0] != '{') {
      const std::string_view a = FirstCharacter(part);
      absl::StrAppend(&fixed, "\\sqrt{", View(a), "}", View(part.substr(a.size())));
    } else {
      absl::StrAppend(&fixed, "\\sqrt", View(part));
    }
  }
  return fixed;
}

}  // namespace

std::optional<std::string> LastBoxedOnlyString(std::string_view text) {
  size_t index = text.rfind("\\boxed");
  if (Contains(text, "\\boxed ")) {
    const std::vector<std::string> after = Split(text, "\\boxed ");
    return absl::StrCat("\\boxed ", Split(after.back(), "$")[0]);
  }
  if (index == std::string_view::npos) {
    index = text.rfind("\\fbox");
    if (index == std::string_view::npos) return std::nullopt;
  }
  int open = 0;
  for (size_t i = index; i < text.size(); ++i) {
    if (text[i] == '{') ++open;
    if (text[i] == '}') {
      --open;
      if (open == 0) return std::string(text.substr(index, i + 1 - index));
    }
  }
  return std::nullopt;
}

std::optional<std::string> RemoveBoxed(std::string_view boxed) {
  if (Contains(boxed, "\\boxed ")) {
    constexpr std::string_view kLeft = "\\boxed ";
    if (boxed.substr(0, kLeft.size()) != kLeft) return std::nullopt;
    return std::string(boxed.substr(kLeft.size()));
  }
  constexpr std::string_view kLeft = "\\boxed{";
  if (boxed.substr(0, kLeft.size()) != kLeft) return std::nullopt;
  if (boxed.back() != '}') return std::nullopt;
  return std::string(boxed.substr(kLeft.size(), boxed.size() - kLeft.size() - 1));
}

std::optional<std::string> StripMathString(std::string_view input) {
  std::string text(input);
  text = ReplaceAll(text, "\n", "");
  text = ReplaceAll(text, "\\!", "");
  text = ReplaceAll(text, "\\\\", "\\");
  text = ReplaceAll(text, "tfrac", "frac");
  text = ReplaceAll(text, "dfrac", "frac");
  text = ReplaceAll(text, "\\left", "");
  text = ReplaceAll(text, "\\right", "");
  text = ReplaceAll(text, "^{\\circ}", "");
  text = ReplaceAll(text, "^\\circ", "");
  text = ReplaceAll(text, "\\$", "");
  std::optional<std::string> without_units = RemoveRightUnits(text);
  if (!without_units) return std::nullopt;
  text = ReplaceAll(*without_units, "\\\\%", "");
  text = ReplaceAll(text, "\\%", "");
  text = ReplaceAll(text, " .", " 0.");
  text = ReplaceAll(text, "{.", "{0.");
  if (text.empty()) return text;
  if (text[0] == '.') text = "0" + text;
  const std::vector<std::string> sides = Split(text, "=");
  if (sides.size() == 2 && CountCharacters(sides[0]) <= 2) text = sides[1];
  std::optional<std::string> with_sqrt = FixSqrt(text);
  if (!with_sqrt) return std::nullopt;
  text = ReplaceAll(*with_sqrt, " ", "");
  std::optional<std::string> with_fracs = FixFracs(text);
  if (!with_fracs) return std::nullopt;
  text = *with_fracs;
  if (text == "0.5") text = "\\frac{1}{2}";
  return FixASlashB(text);
}

bool MathEquivalent(std::string_view answer, std::string_view ground_truth) {
  const std::optional<std::string> a = StripMathString(answer);
  const std::optional<std::string> b = StripMathString(ground_truth);
  if (!a || !b) return answer == ground_truth;
  return *a == *b;
}

double MathScore(std::string_view response, std::string_view ground_truth) {
  const std::optional<std::string> boxed = LastBoxedOnlyString(response);
  if (!boxed) return 0.0;
  const std::optional<std::string> answer = RemoveBoxed(*boxed);
  if (!answer) return 0.0;
  return MathEquivalent(*answer, ground_truth) ? 1.0 : 0.0;
}

}  // namespace rlhfd::reward
