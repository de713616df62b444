// One HTTP/1.1 request parsed incrementally under HttpLimits (http_request.h).
#include "controller/gateway/http_request.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace rlhfd::controller {
namespace {

constexpr size_t kMaxChunkLine = 1024;  // a chunk-size line, extensions included

bool IsToken(absl::string_view text) {
  if (text.empty()) return false;
  for (unsigned char c : text) {
    if (c <= 0x20 || c >= 0x7F || absl::StrContains("()<>@,;:\\\"/[]?={}", c)) return false;
  }
  return true;
}

}  // namespace

std::optional<std::string> UrlDecode(absl::string_view text, bool plus_is_space) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '+' && plus_is_space) {
      out += ' ';
    } else if (c == '%') {
      int value = 0;
      if (i + 2 >= text.size()) return std::nullopt;
      for (int k = 1; k <= 2; ++k) {
        const char h = text[i + k];
        if (!absl::ascii_isxdigit(static_cast<unsigned char>(h))) return std::nullopt;
        value = value * 16 + (absl::ascii_isdigit(static_cast<unsigned char>(h))
                                  ? h - '0'
                                  : absl::ascii_tolower(static_cast<unsigned char>(h)) - 'a' + 10);
      }
      out += static_cast<char>(value);
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
}

const std::string* HttpRequest::Header(absl::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, name)) return &value;
  }
  return nullptr;
}

const std::string* HttpRequest::Param(absl::string_view name) const {
  for (const auto& [key, value] : params) {
    if (key == name) return &value;
  }
  return nullptr;
}

std::vector<std::string> HttpRequest::Params(absl::string_view name) const {
  std::vector<std::string> out;
  for (const auto& [key, value] : params) {
    if (key == name) out.push_back(value);
  }
  return out;
}

size_t RequestParser::Fail(int http_status, absl::Status why) {
  state_ = State::kError;
  error_status_ = http_status;
  error_ = std::move(why);
  return 0;
}

size_t RequestParser::Consume(absl::string_view input) {
  size_t taken = 0;
  if (state_ == State::kHead) {
    // Empty lines before a request line are allowed (RFC 9112 2.2): some clients end a body so.
    while (head_.empty() && taken < input.size() &&
           (input[taken] == '\r' || input[taken] == '\n')) {
      ++taken;
    }
    if (taken == input.size()) return taken;
    started_ = true;
    const size_t scan_from = head_.size() < 3 ? 0 : head_.size() - 3;
    // One byte past the limit tells an over-long head from one that ends exactly at it.
    const size_t piece = std::min(input.size() - taken, limits_.max_head_bytes + 1 - head_.size());
    head_.append(input.data() + taken, piece);
    const size_t end = head_.find("\r\n\r\n", scan_from);
    const size_t counted_to = end == std::string::npos ? head_.size() : end + 2;
    for (size_t i = std::max(scan_from, head_.size() - piece); i < counted_to; ++i) {
      if (head_[i] == '\n') ++head_lines_;
    }
    // The request line is one of the lines; the header lines are the rest.
    if (head_lines_ > limits_.max_header_count + 1) {
      return Fail(431, absl::ResourceExhaustedError(
                           absl::StrCat("the request has more than ", limits_.max_header_count,
                                        " header lines; send fewer headers")));
    }
    if (end == std::string::npos) {
      if (head_.size() > limits_.max_head_bytes) {
        return Fail(431, absl::ResourceExhaustedError(absl::StrCat(
                             "the request line and headers are over ", limits_.max_head_bytes,
                             " bytes; send a shorter URL or fewer, shorter headers")));
      }
      return taken + piece;
    }
    // What follows the head belongs to the body (or the next request).
    const size_t excess = head_.size() - (end + 4);
    head_.resize(end + 4);
    taken += piece - excess;
    if (absl::Status parsed = ParseHead(); !parsed.ok()) {
      const int status = parsed.code() == absl::StatusCode::kResourceExhausted ? 413
                         : parsed.code() == absl::StatusCode::kUnimplemented   ? 501
                                                                               : 400;
      return Fail(status, std::move(parsed));
    }
    state_ = chunked_ || content_length_ > 0 ? State::kBody : State::kDone;
  }
  if (state_ == State::kBody) taken += ConsumeBody(input.substr(taken));
  return taken;
}

absl::Status RequestParser::ParseHead() {
  std::vector<absl::string_view> lines =
      absl::StrSplit(absl::string_view(head_).substr(0, head_.size() - 4), "\r\n");
  const std::vector<absl::string_view> first = absl::StrSplit(lines[0], ' ');
  if (first.size() != 3 || !IsToken(first[0]) || first[1].empty() || first[1][0] != '/') {
    return absl::InvalidArgumentError(
        "the request line is not 'METHOD /path HTTP/1.1' (an origin-form target is required)");
  }
  if (first[2] != "HTTP/1.1" && first[2] != "HTTP/1.0") {
    return absl::InvalidArgumentError("only HTTP/1.1 and HTTP/1.0 are served");
  }
  request_.method = std::string(first[0]);
  keep_alive_ = first[2] == "HTTP/1.1";
  const absl::string_view target = first[1];
  const size_t question = target.find('?');
  const absl::string_view path = target.substr(0, question);
  if (!UrlDecode(path, false))
    return absl::InvalidArgumentError("the path has a malformed %-escape");
  request_.path = std::string(path);
  if (question != absl::string_view::npos) {
    for (absl::string_view item :
         absl::StrSplit(target.substr(question + 1), '&', absl::SkipEmpty())) {
      const size_t equals = item.find('=');
      std::optional<std::string> key = UrlDecode(item.substr(0, equals), true);
      std::optional<std::string> value =
          UrlDecode(equals == absl::string_view::npos ? "" : item.substr(equals + 1), true);
      if (!key || !value) return absl::InvalidArgumentError("the query has a malformed %-escape");
      request_.params.emplace_back(*std::move(key), *std::move(value));
    }
  }
  bool has_length = false;
  for (size_t i = 1; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || !IsToken(line.substr(0, colon))) {
      return absl::InvalidArgumentError(
          "a header line is not 'Name: value' (folded header lines are not accepted)");
    }
    const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    for (unsigned char c : value) {
      if ((c < 0x20 && c != '\t') || c == 0x7F) {
        return absl::InvalidArgumentError("a header value holds a control character");
      }
    }
    std::string name = absl::AsciiStrToLower(line.substr(0, colon));
    if (name == "content-length") {
      size_t length = 0;
      if (value.empty() || value.size() > 18 ||
          !std::all_of(value.begin(), value.end(),
                       [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); })) {
        return absl::InvalidArgumentError("Content-Length is not a number");
      }
      (void)absl::SimpleAtoi(value, &length);
      if (has_length && length != content_length_) {
        return absl::InvalidArgumentError("two different Content-Length headers");
      }
      has_length = true;
      content_length_ = length;
    } else if (name == "transfer-encoding") {
      if (!absl::EqualsIgnoreCase(value, "chunked")) {
        return absl::UnimplementedError(absl::StrCat("Transfer-Encoding '", value.substr(0, 40),
                                                     "' is not served; send chunked or a "
                                                     "Content-Length"));
      }
      chunked_ = true;
    } else if (name == "connection") {
      for (absl::string_view option : absl::StrSplit(value, ',')) {
        option = absl::StripAsciiWhitespace(option);
        if (absl::EqualsIgnoreCase(option, "close")) keep_alive_ = false;
        if (absl::EqualsIgnoreCase(option, "keep-alive")) keep_alive_ = true;
      }
    } else if (name == "expect") {
      expect_continue_ = absl::EqualsIgnoreCase(value, "100-continue");
    }
    request_.headers.emplace_back(std::move(name), std::string(value));
  }
  if (chunked_ && has_length) {
    return absl::InvalidArgumentError("a request with both Transfer-Encoding and Content-Length");
  }
  if (content_length_ > limits_.max_body_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the request body is over ", limits_.max_body_bytes >> 20, " MiB (",
                     limits_.max_body_bytes, " bytes); send a smaller one"));
  }
  return absl::OkStatus();
}

size_t RequestParser::ConsumeBody(absl::string_view input) {
  if (chunked_) return ConsumeChunked(input);
  const size_t piece = std::min(input.size(), content_length_ - request_.body.size());
  request_.body.append(input.data(), piece);
  if (request_.body.size() == content_length_) state_ = State::kDone;
  return piece;
}

size_t RequestParser::ConsumeChunked(absl::string_view input) {
  size_t i = 0;
  while (i < input.size() && state_ == State::kBody) {
    if (chunk_ == Chunk::kData) {
      const size_t piece = std::min(chunk_left_, input.size() - i);
      request_.body.append(input.data() + i, piece);
      chunk_left_ -= piece;
      i += piece;
      if (chunk_left_ == 0) chunk_ = Chunk::kDataEnd;
      continue;
    }
    // The other states read a line.
    const char c = input[i++];
    if (c != '\n') {
      line_ += c;
      const size_t cap = chunk_ == Chunk::kTrailer ? limits_.max_head_bytes : kMaxChunkLine;
      if (line_.size() > cap) {
        return i + Fail(chunk_ == Chunk::kTrailer ? 431 : 400,
                        chunk_ == Chunk::kTrailer
                            ? absl::ResourceExhaustedError("the chunked body's trailer is too long")
                            : absl::InvalidArgumentError("a chunk-size line is too long"));
      }
      continue;
    }
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    if (chunk_ == Chunk::kDataEnd) {
      if (!line_.empty()) {
        return i + Fail(400, absl::InvalidArgumentError("a chunk does not end with CRLF"));
      }
      chunk_ = Chunk::kSize;
    } else if (chunk_ == Chunk::kSize) {
      const absl::string_view digits =
          absl::StripAsciiWhitespace(absl::string_view(line_).substr(0, line_.find(';')));
      size_t size = 0;
      if (digits.empty() || digits.size() > 15 ||
          !std::all_of(
              digits.begin(), digits.end(),
              [](char d) { return absl::ascii_isxdigit(static_cast<unsigned char>(d)); }) ||
          !absl::SimpleHexAtoi(digits, &size)) {
        return i + Fail(400, absl::InvalidArgumentError("a chunk size is not a hex number"));
      }
      if (size == 0) {
        chunk_ = Chunk::kTrailer;
      } else if (size > limits_.max_body_bytes - request_.body.size()) {
        return i + Fail(413, absl::ResourceExhaustedError(absl::StrCat(
                                 "the request body is over ", limits_.max_body_bytes >> 20,
                                 " MiB (", limits_.max_body_bytes,
                                 " bytes) once de-chunked; send a smaller one")));
      } else {
        chunk_left_ = size;
        chunk_ = Chunk::kData;
      }
    } else if (line_.empty()) {  // kTrailer: the empty line ends the request
      state_ = State::kDone;
    }
    line_.clear();
  }
  return i;
}

HttpRequest RequestParser::Take() {
  HttpRequest request = std::move(request_);
  *this = RequestParser(limits_);
  return request;
}

}  // namespace rlhfd::controller
