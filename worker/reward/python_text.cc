#include "worker/reward/python_text.h"

#include <algorithm>
#include <cstdint>
#include <span>

#include "common/util/text.h"

namespace rlhfd::reward {
namespace {

struct CodePointRange {
  char32_t first;
  char32_t last;
};

struct LowerRun {
  char32_t first;
  char32_t last;
  int32_t stride;
  int32_t delta;
};

#include "worker/reward/python_unicode_tables.inc"

// Outside Unicode's range, so in no class.
constexpr char32_t kMalformedByte = 0x110000;

bool InRanges(std::span<const CodePointRange> ranges, char32_t code_point) {
  const auto after = std::upper_bound(
      ranges.begin(), ranges.end(), code_point,
      [](char32_t point, const CodePointRange& range) { return point < range.first; });
  return after != ranges.begin() && code_point <= std::prev(after)->last;
}

char32_t Decode(std::string_view bytes) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  switch (bytes.size()) {
    case 1:
      return byte(0) < 0x80 ? byte(0) : kMalformedByte;
    case 2:
      return ((byte(0) & 0x1F) << 6) | (byte(1) & 0x3F);
    case 3:
      return ((byte(0) & 0x0F) << 12) | ((byte(1) & 0x3F) << 6) | (byte(2) & 0x3F);
    case 4:
      return ((byte(0) & 0x07) << 18) | ((byte(1) & 0x3F) << 12) | ((byte(2) & 0x3F) << 6) |
             (byte(3) & 0x3F);
  }
  return kMalformedByte;
}

void AppendUtf8(char32_t code_point, std::string* out) {
  if (code_point < 0x80) {
    out->push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

}  // namespace

PythonCharacter PythonCharacterAt(std::string_view text, size_t offset) {
  const size_t size = CharacterBytesAt(absl::string_view(text.data(), text.size()), offset);
  return {Decode(text.substr(offset, size)), offset, size};
}

std::vector<PythonCharacter> PythonCharacters(std::string_view text) {
  std::vector<PythonCharacter> characters;
  for (size_t offset = 0; offset < text.size(); offset += characters.back().size) {
    characters.push_back(PythonCharacterAt(text, offset));
  }
  return characters;
}

bool IsPythonSpace(char32_t code_point) { return InRanges(kPythonSpace, code_point); }
bool IsPythonDigit(char32_t code_point) { return InRanges(kPythonDigit, code_point); }
bool IsPythonWordCharacter(char32_t code_point) { return InRanges(kPythonWord, code_point); }

bool PythonIsDigit(std::string_view text) {
  const std::vector<PythonCharacter> characters = PythonCharacters(text);
  return !characters.empty() &&
         std::all_of(characters.begin(), characters.end(),
                     [](const PythonCharacter& c) { return IsPythonDigit(c.code_point); });
}

std::string PythonLower(std::string_view text) {
  std::string lowered;
  lowered.reserve(text.size());
  for (const PythonCharacter& c : PythonCharacters(text)) {
    if (c.code_point == 0x130) {  // the one character str.lower makes two of
      lowered += "i\u0307";
      continue;
    }
    const auto after =
        std::upper_bound(std::begin(kPythonLower), std::end(kPythonLower), c.code_point,
                         [](char32_t point, const LowerRun& run) { return point < run.first; });
    if (after != std::begin(kPythonLower)) {
      const LowerRun& run = *std::prev(after);
      if (c.code_point <= run.last && (c.code_point - run.first) % run.stride == 0) {
        AppendUtf8(static_cast<char32_t>(static_cast<int32_t>(c.code_point) + run.delta), &lowered);
        continue;
      }
    }
    lowered.append(text.substr(c.offset, c.size));
  }
  return lowered;
}

std::string_view PythonStrip(std::string_view text) {
  const std::vector<PythonCharacter> characters = PythonCharacters(text);
  size_t first = 0, last = characters.size();
  while (first < last && IsPythonSpace(characters[first].code_point)) ++first;
  while (last > first && IsPythonSpace(characters[last - 1].code_point)) --last;
  if (first == last) return text.substr(0, 0);
  const size_t begin = characters[first].offset;
  return text.substr(begin, characters[last - 1].offset + characters[last - 1].size - begin);
}

std::vector<std::string_view> PythonSplit(std::string_view text) {
  std::vector<std::string_view> words;
  size_t start = std::string_view::npos;
  for (const PythonCharacter& c : PythonCharacters(text)) {
    if (IsPythonSpace(c.code_point)) {
      if (start != std::string_view::npos) words.push_back(text.substr(start, c.offset - start));
      start = std::string_view::npos;
    } else if (start == std::string_view::npos) {
      start = c.offset;
    }
  }
  if (start != std::string_view::npos) words.push_back(text.substr(start));
  return words;
}

}  // namespace rlhfd::reward
