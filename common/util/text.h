// Text that comes from outside (config files, RPC fields, model files): UTF-8 validity, control
// characters, and safe truncation, so nothing a peer sends can break a JSON writer or a terminal.
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace rlhfd {

// True when `text` is well-formed UTF-8 (no overlong forms, no surrogates, <= U+10FFFF).
bool IsValidUtf8(absl::string_view text);

// Byte offset of the first byte that breaks UTF-8, or npos when the text is valid.
size_t FirstInvalidUtf8(absl::string_view text);

// The first C0/C1 control character or DEL in `text` (tab, newline and carriage return too),
// as a code point, or -1 when there is none. `text` must be valid UTF-8.
int FirstControlCharacter(absl::string_view text);

// For logs, tables and error messages: invalid bytes become U+FFFD, control characters become
// `\xNN` / `\u00NN`, and the result is cut to at most `max_bytes` on a character boundary
// ("..." appended when cut).
std::string SanitizeForDisplay(absl::string_view text, size_t max_bytes = 200);

// `text` cut to at most `max_bytes` without splitting a UTF-8 sequence.
absl::string_view TruncateUtf8(absl::string_view text, size_t max_bytes);

// `text` without a last UTF-8 sequence that its end cuts short (a lead byte with fewer
// continuation bytes after it than it announces). Every other byte stays, valid or not, so
// text that is not UTF-8 loses at most 3 bytes.
absl::string_view WithoutCutUtf8Tail(absl::string_view text);

// Counting in characters as Python's str does, for code that must match Python text handling
// (reward rules): the bytes of the character at `offset` (a malformed byte counts as one
// character of one byte), the number of characters, and the last `count` characters.
size_t CharacterBytesAt(absl::string_view text, size_t offset);
size_t CountCharacters(absl::string_view text);
absl::string_view LastCharacters(absl::string_view text, size_t count);
// Python's str.strip() (and so Jinja's trim, which chat templates apply): `text` without the
// characters at either end for which str.isspace() holds, Unicode's (U+00A0, U+3000, ...) too.
absl::string_view StripPythonWhitespace(absl::string_view text);

}  // namespace rlhfd
