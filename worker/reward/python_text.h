// Python's str and re over UTF-8 text, for rules that must score exactly as verl's Python does:
// whitespace (str.isspace, strip, split), digits (str.isdigit), word characters (re's \w) and
// str.lower, from tables generated from Python itself (make_python_unicode_tables.py).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace rlhfd::reward {

// One character of UTF-8 text as Python's str holds it. A byte that is not part of well-formed
// UTF-8 is a character of its own, with a code point no class below contains.
struct PythonCharacter {
  char32_t code_point;
  size_t offset;  // in bytes
  size_t size;    // in bytes
};
std::vector<PythonCharacter> PythonCharacters(std::string_view text);
// The character at byte `offset` (< text.size()).
PythonCharacter PythonCharacterAt(std::string_view text, size_t offset);

bool IsPythonSpace(char32_t code_point);
bool IsPythonDigit(char32_t code_point);
bool IsPythonWordCharacter(char32_t code_point);

// str.isdigit(): not empty, and every character a digit.
bool PythonIsDigit(std::string_view text);
// str.lower().
std::string PythonLower(std::string_view text);
// str.strip() with no argument.
std::string_view PythonStrip(std::string_view text);
// str.split() with no argument: the runs between whitespace.
std::vector<std::string_view> PythonSplit(std::string_view text);

}  // namespace rlhfd::reward
