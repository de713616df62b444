// One HTTP/1.1 request as the REST gateway's server (http_server.h) reads it: the request, the
// reply, the limits a client meets, and the incremental parser that enforces them.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace rlhfd::controller {

struct HttpRequest {
  std::string method;                                        // as sent: "GET", "POST"
  // As sent, %-escapes kept (checked well-formed), without the query: a route matches the path's
  // segments first and decodes the ids it takes, so that an escaped '/' or ':' stays in its id.
  std::string path;
  std::vector<std::pair<std::string, std::string>> params;   // the query, decoded, in order
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case
  std::string body;                                          // de-chunked

  // The first header or query parameter of that name (header names in any case); nullptr if none.
  const std::string* Header(absl::string_view name) const;
  const std::string* Param(absl::string_view name) const;
  // Every value of a query parameter, in order (`override=a&override=b`).
  std::vector<std::string> Params(absl::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // more headers, repeats allowed
};

// What a client may send and how long it may take; exceeding one gets the status named, then the
// connection is closed. All are enforced before a handler (and so authentication) sees a byte.
struct HttpLimits {
  size_t max_head_bytes = 32 << 10;          // request line + headers: 431
  size_t max_header_count = 100;             // header lines: 431
  size_t max_body_bytes = (1 << 20) + 4096;  // Content-Length or de-chunked: 413
  // After an error reply the server reads and drops at most this much more of the request (so
  // a client that writes its whole body before reading sees the reply), then closes.
  size_t max_drain_bytes = 16 << 20;
  absl::Duration head_timeout = absl::Seconds(10);   // accept (or first byte) to end of head: 408
  absl::Duration body_timeout = absl::Seconds(30);   // end of head to end of body: 408
  absl::Duration idle_timeout = absl::Seconds(30);   // keep-alive wait for the next request
  absl::Duration write_timeout = absl::Seconds(30);  // writing one reply
  absl::Duration drain_timeout = absl::Seconds(5);
};

// The incremental parser of one request, fed bytes as they arrive; the server's own bounds
// live here, where a unit test can reach them without sockets.
class RequestParser {
 public:
  enum class State { kHead, kBody, kDone, kError };
  explicit RequestParser(const HttpLimits& limits) : limits_(limits) {}

  // Consumes what belongs to the current request from `input`; returns how many bytes it took
  // (fewer than given once the request is done or refused: the rest is the next request's).
  size_t Consume(absl::string_view input);
  State state() const { return state_; }
  bool started() const { return started_; }                   // a byte of this request has arrived
  size_t body_bytes() const { return request_.body.size(); }  // received so far
  // Valid from kBody on.
  bool expects_continue() const { return expect_continue_; }
  bool keep_alive() const { return keep_alive_; }
  // kError: the status to answer and why.
  int error_status() const { return error_status_; }
  const absl::Status& error() const { return error_; }
  // kDone: the request; the parser is then ready for the next one.
  HttpRequest Take();

 private:
  size_t Fail(int http_status, absl::Status why);
  absl::Status ParseHead();
  size_t ConsumeBody(absl::string_view input);
  size_t ConsumeChunked(absl::string_view input);

  HttpLimits limits_;
  State state_ = State::kHead;
  bool started_ = false;
  std::string head_;
  size_t head_lines_ = 0;
  HttpRequest request_;
  bool chunked_ = false;
  size_t content_length_ = 0;
  bool expect_continue_ = false;
  bool keep_alive_ = true;
  // The chunked decoder: reading a size line, a chunk's data, its CRLF, or the trailer.
  enum class Chunk { kSize, kData, kDataEnd, kTrailer } chunk_ = Chunk::kSize;
  std::string line_;
  size_t chunk_left_ = 0;
  int error_status_ = 0;
  absl::Status error_;
};

// Percent-decoding of a URL's path (`plus_is_space` false) or query component (true); nullopt
// for a malformed escape.
std::optional<std::string> UrlDecode(absl::string_view text, bool plus_is_space);

}  // namespace rlhfd::controller
