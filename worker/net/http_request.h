// One HTTP exchange through libcurl, for the clients of services outside the job (the remote
// reward and HTTP tool's JSON posts, the checkpoint upload's S3 requests): a deadline, a cap on
// the reply held in memory (or the reply streamed to a file), an upload streamed from a file
// range, cancellation, and every failure named with where it went and what came back.
// Thread-safe: each call has its own connection.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace rlhfd::net {

struct HttpRequest {
  std::string method = "GET";
  std::string url;  // http:// or https:// (other schemes are refused by curl)
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;  // sent unless upload_path is set
  // The body read from this file, `upload_length` bytes from `upload_offset` (multipart parts).
  std::string upload_path;
  int64_t upload_offset = 0;
  int64_t upload_length = 0;
  // The reply's body written to this open file descriptor instead of memory (any length).
  int download_fd = -1;
  // The whole exchange, connecting included; zero: none, only `stall_timeout`.
  absl::Duration timeout = absl::Seconds(30);
  // Fails the exchange when under 1 byte a second moves for this long (a large transfer has no
  // sensible total deadline, a dead peer must still be noticed).
  absl::Duration stall_timeout = absl::Seconds(60);
  size_t max_reply_bytes = 16 << 20;
  const std::atomic<bool>* cancelled = nullptr;  // checked while the transfer runs
  std::string timeout_key;  // the setting the deadline comes from, for its message
};

struct HttpReply {
  // OK for HTTP 2xx; else CANCELLED, INVALID_ARGUMENT (reply over the cap), DEADLINE_EXCEEDED,
  // UNAVAILABLE (connection, 429, 5xx), NOT_FOUND (404) or FAILED_PRECONDITION (other
  // statuses), the message starting with `where`.
  absl::Status status;
  bool retryable = false;  // connection failures, deadlines, 429 and 5xx
  long http_status = 0;
  std::string body;  // the reply held in memory (also of a failed status, for its message)
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case
};

HttpReply Perform(const HttpRequest& request, absl::string_view where);

// The reply header `name` (lower case), or "" when absent.
std::string ReplyHeader(const HttpReply& reply, absl::string_view name);

}  // namespace rlhfd::net
