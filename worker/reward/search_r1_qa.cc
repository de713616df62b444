#include "worker/reward/search_r1_qa.h"

#include "worker/reward/python_text.h"

namespace rlhfd::reward {
namespace {

constexpr std::string_view kOpen = "<answer>", kClose = "</answer>";

// Python's str.count: non-overlapping occurrences.
size_t Count(std::string_view text, std::string_view part) {
  size_t count = 0;
  for (size_t at = text.find(part); at != std::string_view::npos;
       at = text.find(part, at + part.size())) {
    ++count;
  }
  return count;
}

// string.punctuation.
bool IsAsciiPunctuation(char32_t c) {
  return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') ||
         (c >= '{' && c <= '~');
}

// re.sub(r"\b(a|an|the)\b", " ", text), \b between a word character (re's \w) and another.
std::string ReplaceArticles(std::string_view text) {
  const std::vector<PythonCharacter> characters = PythonCharacters(text);
  const auto is_word = [&](size_t i) {
    return i < characters.size() && IsPythonWordCharacter(characters[i].code_point);
  };
  const auto boundary = [&](size_t i) { return (i > 0 && is_word(i - 1)) != is_word(i); };
  std::string out;
  for (size_t i = 0; i < characters.size();) {
    size_t matched = 0;
    if (boundary(i)) {
      for (std::string_view article : {"a", "an", "the"}) {
        size_t k = 0;
        while (k < article.size() && i + k < characters.size() &&
               characters[i + k].code_point == static_cast<char32_t>(article[k])) {
          ++k;
        }
        if (k == article.size() && boundary(i + k)) {
          matched = k;
          break;
        }
      }
    }
    if (matched > 0) {
      out += ' ';
      i += matched;
    } else {
      out += text.substr(characters[i].offset, characters[i].size);
      ++i;
    }
  }
  return out;
}

}  // namespace

std::optional<std::string_view> ExtractTaggedAnswer(std::string_view response) {
  std::optional<std::string_view> last;
  for (size_t open = response.find(kOpen); open != std::string_view::npos;) {
    const size_t inside = open + kOpen.size();
    const size_t close = response.find(kClose, inside);
    if (close == std::string_view::npos) break;
    last = response.substr(inside, close - inside);
    open = response.find(kOpen, close + kClose.size());
  }
  if (!last) return std::nullopt;
  return PythonStrip(*last);
}

std::string NormalizeQaAnswer(std::string_view answer) {
  std::string lowered = PythonLower(answer);
  std::string unpunctuated;
  for (const PythonCharacter& c : PythonCharacters(lowered)) {
    if (!IsAsciiPunctuation(c.code_point)) unpunctuated.append(lowered, c.offset, c.size);
  }
  const std::string spaced = ReplaceArticles(unpunctuated);
  std::string joined;
  for (std::string_view word : PythonSplit(spaced)) {
    if (!joined.empty()) joined += ' ';
    joined += word;
  }
  return joined;
}

double SearchR1QaScore(std::string_view response, const std::vector<std::string>& targets) {
  const std::optional<std::string_view> answer = ExtractTaggedAnswer(response);
  if (!answer) return 0.0;
  const std::string prediction = NormalizeQaAnswer(*answer);
  for (const std::string& target : targets) {
    if (NormalizeQaAnswer(target) != prediction) continue;
    // Against responses that repeat the tags to be matched more often.
    return Count(response, kOpen) > 10 || Count(response, kClose) > 10 ? 0.25 : 1.0;
  }
  return 0.0;
}

}  // namespace rlhfd::reward
