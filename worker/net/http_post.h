// One HTTP POST of a JSON body to a service the user runs (the remote reward, the HTTP tool):
// a deadline, a cap on the reply, cancellation, and every failure named with where it went and
// what came back. Thread-safe: each call has its own connection.
#pragma once

#include <atomic>
#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace rlhfd::net {

struct HttpPost {
  std::string url;  // http:// or https:// (other schemes are refused by curl)
  absl::Duration timeout = absl::Seconds(30);  // connecting included
  size_t max_reply_bytes = 16 << 20;
  const std::atomic<bool>* cancelled = nullptr;  // checked while the transfer runs
  std::string timeout_key;  // the setting the deadline comes from, for its message
};

struct HttpReply {
  // OK for HTTP 200; else CANCELLED, INVALID_ARGUMENT (reply over the cap), DEADLINE_EXCEEDED,
  // UNAVAILABLE (connection, 429, 5xx) or FAILED_PRECONDITION (other statuses), the message
  // starting with `where`.
  absl::Status status;
  bool retryable = false;  // connection failures, deadlines, 429 and 5xx
  std::string body;        // the reply (also of a failed status, for its message)
};

HttpReply PostJson(const HttpPost& post, const std::string& body, absl::string_view where);

}  // namespace rlhfd::net
