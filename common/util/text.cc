// UTF-8 checks and display sanitising; see text.h.
#include "common/util/text.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_format.h"

namespace rlhfd {
namespace {

// Length of the well-formed UTF-8 sequence at `i`, and its code point; 0 when malformed.
size_t DecodeAt(absl::string_view text, size_t i, uint32_t* code_point) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t lead = byte(i);
  if (lead < 0x80) {
    *code_point = lead;
    return 1;
  }
  size_t length;
  uint32_t value, minimum;
  if ((lead & 0xE0) == 0xC0) {
    length = 2, value = lead & 0x1F, minimum = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, value = lead & 0x0F, minimum = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, value = lead & 0x07, minimum = 0x10000;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    value = (value << 6) | (byte(i + k) & 0x3F);
  }
  if (value < minimum || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) return 0;
  *code_point = value;
  return length;
}

bool IsControl(uint32_t code_point) {
  return code_point < 0x20 || (code_point >= 0x7F && code_point <= 0x9F);
}

}  // namespace

size_t FirstInvalidUtf8(absl::string_view text) {
  uint32_t code_point;
  for (size_t i = 0; i < text.size();) {
    const size_t length = DecodeAt(text, i, &code_point);
    if (length == 0) return i;
    i += length;
  }
  return absl::string_view::npos;
}

bool IsValidUtf8(absl::string_view text) {
  return FirstInvalidUtf8(text) == absl::string_view::npos;
}

int FirstControlCharacter(absl::string_view text) {
  uint32_t code_point;
  for (size_t i = 0; i < text.size();) {
    const size_t length = DecodeAt(text, i, &code_point);
    if (length == 0) return -1;
    if (IsControl(code_point)) return static_cast<int>(code_point);
    i += length;
  }
  return -1;
}

absl::string_view TruncateUtf8(absl::string_view text, size_t max_bytes) {
  return text.size() <= max_bytes ? text : WithoutCutUtf8Tail(text.substr(0, max_bytes));
}

absl::string_view WithoutCutUtf8Tail(absl::string_view text) {
  // The last lead byte among the last four, and how many bytes its sequence needs.
  for (size_t back = 1; back <= std::min<size_t>(4, text.size()); ++back) {
    const uint8_t byte = static_cast<uint8_t>(text[text.size() - back]);
    if ((byte & 0xC0) == 0x80) continue;  // a continuation byte
    const size_t needs = (byte & 0xE0) == 0xC0   ? 2
                         : (byte & 0xF0) == 0xE0 ? 3
                         : (byte & 0xF8) == 0xF0 ? 4
                                                 : 1;
    return back < needs ? text.substr(0, text.size() - back) : text;
  }
  return text;
}

std::string SanitizeForDisplay(absl::string_view text, size_t max_bytes) {
  std::string out;
  uint32_t code_point;
  for (size_t i = 0; i < text.size();) {
    const size_t length = DecodeAt(text, i, &code_point);
    std::string piece;
    if (length == 0) {
      piece = "\xEF\xBF\xBD";  // U+FFFD
      i += 1;
    } else if (IsControl(code_point)) {
      piece = code_point < 0x80 ? absl::StrFormat("\\x%02X", code_point)
                                : absl::StrFormat("\\u%04X", code_point);
      i += length;
    } else {
      piece = std::string(text.substr(i, length));
      i += length;
    }
    if (out.size() + piece.size() > max_bytes) {
      out += "...";
      return out;
    }
    out += piece;
  }
  return out;
}

size_t CharacterBytesAt(absl::string_view text, size_t offset) {
  uint32_t code_point;
  const size_t length = DecodeAt(text, offset, &code_point);
  return length == 0 ? 1 : length;
}

size_t CountCharacters(absl::string_view text) {
  size_t count = 0;
  for (size_t i = 0; i < text.size(); i += CharacterBytesAt(text, i)) ++count;
  return count;
}

absl::string_view LastCharacters(absl::string_view text, size_t count) {
  const size_t total = CountCharacters(text);
  if (total <= count) return text;
  size_t offset = 0;
  for (size_t skip = total - count; skip > 0; --skip) offset += CharacterBytesAt(text, offset);
  return text.substr(offset);
}

namespace {

// Python's str.isspace(): bidirectional class WS, B or S, or general category Zs.
bool IsPythonSpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

}  // namespace

absl::string_view StripPythonWhitespace(absl::string_view text) {
  size_t begin = text.size(), end = 0;  // the first and past the last character kept
  for (size_t i = 0; i < text.size();) {
    uint32_t code_point = 0;
    const size_t length = DecodeAt(text, i, &code_point);
    const size_t step = length == 0 ? 1 : length;  // a malformed byte is kept, as one character
    if (length == 0 || !IsPythonSpace(code_point)) {
      begin = std::min(begin, i);
      end = i + step;
    }
    i += step;
  }
  return begin < end ? text.substr(begin, end - begin) : absl::string_view();
}

}  // namespace rlhfd
