// The tokenizer's UTF-8, byte-map, regex and whitespace helpers; see tokenizer_internal.h.
#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "worker/model/tokenizer_internal.h"

namespace rlhfd::model::tokenizer_internal {

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Decodes one UTF-8 sequence at `i`. Returns its length and sets `cp`, or returns the length of
// the maximal invalid subpart (>= 1) with cp = UINT32_MAX (Unicode's substitution practice,
// which Rust's from_utf8_lossy follows).
size_t DecodeUtf8(absl::string_view s, size_t i, uint32_t* cp) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = byte(i);
  *cp = UINT32_MAX;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t length;
  uint8_t low = 0x80, high = 0xBF;
  uint32_t value;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2, value = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3, value = b0 & 0x0F;
    if (b0 == 0xE0) low = 0xA0;
    if (b0 == 0xED) high = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4, value = b0 & 0x07;
    if (b0 == 0xF0) low = 0x90;
    if (b0 == 0xF4) high = 0x8F;
  } else {
    return 1;
  }
  for (size_t k = 1; k < length; ++k) {
    if (i + k >= s.size()) return k;
    const uint8_t b = byte(i + k);
    if (b < (k == 1 ? low : 0x80) || b > (k == 1 ? high : 0xBF)) return k;
    value = (value << 6) | (b & 0x3F);
  }
  *cp = value;
  return length;
}

bool IsValidUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    i += DecodeUtf8(s, i, &cp);
    if (cp == UINT32_MAX) return false;
  }
  return true;
}

std::string LossyUtf8(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    const size_t n = DecodeUtf8(s, i, &cp);
    if (cp == UINT32_MAX) {
      out += kReplacement;
    } else {
      out.append(s.data() + i, n);
    }
    i += n;
  }
  return out;
}

ByteMap::ByteMap() {
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const uint32_t cp = printable ? b : next++;
    AppendUtf8(cp, &to_unicode[b]);
    to_byte[cp] = static_cast<uint8_t>(b);
  }
}

const ByteMap& Bytes() {
  static const ByteMap map;
  return map;
}

absl::StatusOr<Regex> CompileRegex(const std::string& pattern, absl::string_view source) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat(source,
                                                   ": pre-tokenizer pattern does not compile at ",
                                                   offset, ": ", reinterpret_cast<char*>(message)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // Falls back to the interpreter if unavailable.
  return Regex(code, RegexDeleter());
}

// Splits `text` into matches and the gaps between them ("Isolated" behaviour), in order.
void SplitIsolated(const Regex& regex, absl::string_view text, std::vector<std::string>* out) {
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(regex.get(), nullptr);
  size_t start = 0, gap = 0;
  while (start <= text.size()) {
    const int rc = pcre2_match(regex.get(), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                               start, PCRE2_NO_UTF_CHECK, match, nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
    const size_t begin = ovector[0], end = ovector[1];
    if (begin > gap) out->emplace_back(text.substr(gap, begin - gap));
    if (end > begin) out->emplace_back(text.substr(begin, end - begin));
    gap = end;
    if (end == begin) {
      // Empty match: step over one whole character.
      uint32_t cp;
      if (end >= text.size()) break;
      start = end + DecodeUtf8(text, end, &cp);
    } else {
      start = end;
    }
  }
  if (gap < text.size()) out->emplace_back(text.substr(gap));
  pcre2_match_data_free(match);
}

// Unicode White_Space (what tokenizers' lstrip / rstrip test, Rust's char::is_whitespace).
bool IsWhitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// The code point starting at byte `i` of valid UTF-8 `text`, and its length.
std::pair<uint32_t, size_t> CodePointAt(absl::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t lead = byte(i);
  if (lead < 0x80) return {lead, 1};
  const size_t length = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
  uint32_t c = lead & (0x7F >> length);
  for (size_t k = 1; k < length; ++k) c = (c << 6) | (byte(i + k) & 0x3F);
  return {c, length};
}

// Where the whitespace run ending at `end` starts, not before `floor`.
size_t WhitespaceRunStart(absl::string_view text, size_t floor, size_t end) {
  while (end > floor) {
    size_t start = end - 1;
    while (start > floor && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
    if (!IsWhitespace(CodePointAt(text, start).first)) break;
    end = start;
  }
  return end;
}

// Where the whitespace run starting at `begin` ends.
size_t WhitespaceRunEnd(absl::string_view text, size_t begin) {
  while (begin < text.size()) {
    const auto [c, length] = CodePointAt(text, begin);
    if (!IsWhitespace(c)) break;
    begin += length;
  }
  return begin;
}

}  // namespace rlhfd::model::tokenizer_internal
