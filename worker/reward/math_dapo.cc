#include "worker/reward/math_dapo.h"

#include <array>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/util/text.h"
#include "worker/reward/python_text.h"

namespace rlhfd::reward {
namespace {

absl::string_view View(std::string_view text) { return {text.data(), text.size()}; }

std::string_view LastCharactersOf(std::string_view text, size_t count) {
  const absl::string_view last = LastCharacters(View(text), count);
  return {last.data(), last.size()};
}

// SUBSTITUTIONS, then REMOVED_EXPRESSIONS, each a str.replace in this order.
constexpr std::pair<std::string_view, std::string_view> kSubstitutions[] = {
    {"an ", ""},          {"a ", ""},
    {".$", "$"},          {"\\$", ""},
    {"\\ ", ""},          {" ", ""},
    {"mbox", "text"},     {",\\text{and}", ","},
    {"\\text{and}", ","}, {"\\text{m}", "\\text{}"},
};
constexpr std::string_view kRemovedExpressions[] = {
    "square",     "ways",       "integers",  "dollars",      "mph",
    "inches",     "hours",      "km",        "units",        "\\ldots",
    "sue",        "points",     "feet",      "minutes",      "digits",
    "cents",      "degrees",    "cm",        "gm",           "pounds",
    "meters",     "meals",      "edges",     "students",     "childrentickets",
    "multiples",  "\\text{s}",  "\\text{.}", "\\text{\ns}",  "\\text{}^2",
    "\\text{}^3", "\\text{\n}", "\\text{}",  "\\mathrm{th}", "^\\circ",
    "^{\\circ}",  "\\;",        ",\\!",      "{,}",          "\"",
    "\\dots",
};

std::string Replace(std::string_view text, std::string_view from, std::string_view to) {
  return absl::StrReplaceAll(View(text), {{View(from), View(to)}});
}

// re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", text): '.' stops at a newline, so each line with
// two '$' becomes what its first two enclose, between '$'.
std::string KeepFirstDollarPair(std::string_view text) {
  std::string kept;
  for (size_t start = 0;;) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string_view line = text.substr(start, end - start);
    const size_t open = line.find('$');
    const size_t close = open == std::string_view::npos ? open : line.find('$', open + 1);
    if (close != std::string_view::npos) {
      kept += '$';
      kept += line.substr(open + 1, close - open - 1);
      kept += '$';
    } else {
      kept += line;
    }
    if (end == text.size()) break;
    kept += '\n';
    start = end + 1;
  }
  return kept;
}

// re.sub(r"(PREFIX)(.*?)(\})", "\\2", text) for a PREFIX ending in '{': the text up to the
// first '}' on the same line, unwrapped.
std::string UnwrapToFirstBrace(std::string_view text, std::string_view prefix) {
  std::string out;
  size_t copied = 0;
  for (size_t at = text.find(prefix); at != std::string_view::npos;
       at = text.find(prefix, at + 1)) {
    if (at < copied) continue;
    const size_t inside = at + prefix.size();
    const size_t close = text.find('}', inside);
    if (close == std::string_view::npos) break;
    if (text.substr(inside, close - inside).find('\n') != std::string_view::npos) continue;
    out += text.substr(copied, at - copied);
    out += text.substr(inside, close - inside);
    copied = close + 1;
  }
  out += text.substr(copied);
  return out;
}

// re.sub(r"(\\boxed\{)(.*)(\})", "\\2", text): from a "\boxed{" to the last '}' on its line.
std::string UnwrapBoxedToLastBrace(std::string_view text) {
  constexpr std::string_view kBoxed = "\\boxed{";
  std::string out;
  size_t copied = 0;
  for (size_t at = text.find(kBoxed); at != std::string_view::npos;
       at = text.find(kBoxed, at + 1)) {
    if (at < copied) continue;
    const size_t inside = at + kBoxed.size();
    const size_t line_end = std::min(text.find('\n', at), text.size());
    const size_t close = text.substr(0, line_end).rfind('}');
    if (close == std::string_view::npos || close < inside) continue;
    out += text.substr(copied, at - copied);
    out += text.substr(inside, close - inside);
    copied = close + 1;
  }
  out += text.substr(copied);
  return out;
}

// re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", text) (`braced_second`) or
// re.sub(r"(sqrt)([^{])", "sqrt{\\2}", text): [^{] takes any character but '{' (a newline too),
// '.' any but a newline.
std::string BraceShorthand(std::string_view text, std::string_view command, bool braced_second) {
  std::string out;
  size_t copied = 0;
  for (size_t at = text.find(command); at != std::string_view::npos;
       at = text.find(command, at + 1)) {
    if (at < copied) continue;
    const size_t first = at + command.size();
    if (first >= text.size() || text[first] == '{') continue;
    const size_t first_size = CharacterBytesAt(View(text), first);
    size_t end = first + first_size;
    std::string replaced =
        absl::StrCat(View(command), "{", View(text.substr(first, first_size)), "}");
    if (braced_second) {
      if (end >= text.size() || text[end] == '\n') continue;
      const size_t second_size = CharacterBytesAt(View(text), end);
      absl::StrAppend(&replaced, "{", View(text.substr(end, second_size)), "}");
      end += second_size;
    }
    out += text.substr(copied, at - copied);
    out += replaced;
    copied = end;
  }
  out += text.substr(copied);
  return out;
}

// is_correct_strict_box's answer: the inside of the last "\boxed{...}" of the last 100
// characters, or nullopt.
std::optional<std::string> LastBoxedInside(std::string_view text) {
  text = LastCharactersOf(text, 100);
  const size_t start = text.rfind("\\boxed{");
  if (start == std::string_view::npos) return std::nullopt;
  int open = 0;
  for (size_t i = start; i < text.size(); ++i) {
    if (text[i] == '{') ++open;
    if (text[i] == '}' && --open == 0) {
      const size_t inside = start + 7;
      return std::string(text.substr(inside, i - inside));
    }
  }
  return std::nullopt;
}

// "answer" with Python's re.IGNORECASE over str: 's' also matches U+017F (LATIN SMALL LETTER
// LONG S); no other character folds onto these letters. The length matched, or 0.
size_t MatchAnswerWord(std::string_view text, size_t at) {
  size_t i = at;
  for (char letter : std::string_view("answer")) {
    if (i < text.size() && (text[i] | 0x20) == letter) {
      ++i;
    } else if (letter == 's' && text.substr(i, 2) == "\xC5\xBF") {
      i += 2;
    } else {
      return 0;
    }
  }
  return i - at;
}

// The end of the whitespace run starting at `at`.
size_t SkipSpace(std::string_view text, size_t at) {
  while (at < text.size()) {
    const PythonCharacter c = PythonCharacterAt(text, at);
    if (!IsPythonSpace(c.code_point)) break;
    at += c.size;
  }
  return at;
}

}  // namespace

std::optional<std::string> LastMinervaAnswer(std::string_view text) {
  std::optional<std::string> last;
  for (size_t at = 0; at < text.size();) {
    const size_t word = MatchAnswerWord(text, at);
    if (word == 0) {
      ++at;
      continue;
    }
    const size_t colon = SkipSpace(text, at + word);
    if (colon >= text.size() || text[colon] != ':') {
      ++at;
      continue;
    }
    const size_t run_end = SkipSpace(text, colon + 1);
    if (run_end < text.size()) {
      // \s* takes the whole run; [^\n]+ the rest of the line.
      const size_t line_end = std::min(text.find('\n', run_end), text.size());
      last = std::string(text.substr(run_end, line_end - run_end));
      at = line_end;
      continue;
    }
    // The run reaches the end: \s* gives back down to its last character that is not a newline,
    // which [^\n]+ then takes alone (newlines follow it).
    std::optional<std::pair<size_t, size_t>> taken;
    for (const PythonCharacter& c : PythonCharacters(text.substr(colon + 1))) {
      if (c.code_point != '\n') taken = {colon + 1 + c.offset, c.size};
    }
    if (!taken) {
      ++at;
      continue;
    }
    last = std::string(text.substr(taken->first, taken->second));
    at = taken->first + taken->second;
  }
  return last;
}

std::string NormalizeDapoAnswer(std::string_view answer) {
  const size_t equals = answer.rfind('=');
  std::string text(equals == std::string_view::npos ? answer : answer.substr(equals + 1));
  for (const auto& [before, after] : kSubstitutions) text = Replace(text, before, after);
  for (std::string_view expression : kRemovedExpressions) text = Replace(text, expression, "");
  text = KeepFirstDollarPair(text);
  text = UnwrapToFirstBrace(text, "\\text{");
  text = UnwrapToFirstBrace(text, "\\textbf{");
  text = UnwrapToFirstBrace(text, "\\overline{");
  text = UnwrapBoxedToLastBrace(text);
  text = BraceShorthand(text, "frac", /*braced_second=*/true);
  text = BraceShorthand(text, "sqrt", /*braced_second=*/false);
  text = Replace(text, "$", "");
  if (PythonIsDigit(Replace(text, ",", ""))) text = Replace(text, ",", "");
  return std::string(PythonStrip(text));
}

double MathDapoScore(std::string_view response, std::string_view ground_truth) {
  // default_compute_score passes neither strict_box_verify nor pause_tokens_index.
  const std::string_view solution = LastCharactersOf(response, 300);
  const std::string prediction =
      NormalizeDapoAnswer(LastMinervaAnswer(solution).value_or("[INVALID]"));
  bool correct = prediction == NormalizeDapoAnswer(ground_truth);
  if (prediction == "[INVALID]") {
    // No Minerva answer: the boxed one decides when there is one.
    const std::optional<std::string> boxed = LastBoxedInside(solution);
    if (boxed) correct = *boxed == ground_truth;
  }
  return correct ? 1.0 : -1.0;
}

}  // namespace rlhfd::reward
