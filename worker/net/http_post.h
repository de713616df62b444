// One HTTP POST of a JSON body to a service the user runs (the remote reward, the HTTP tool).
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "worker/net/http_request.h"

namespace rlhfd::net {

struct HttpPost {
  std::string url;                             // http:// or https://
  absl::Duration timeout = absl::Seconds(30);  // connecting included
  size_t max_reply_bytes = 16 << 20;
  const std::atomic<bool>* cancelled = nullptr;  // checked while the transfer runs
  std::string timeout_key;  // the setting the deadline comes from, for its message
};

// Perform() with Content-Type application/json; only HTTP 200 is success.
HttpReply PostJson(const HttpPost& post, const std::string& body, absl::string_view where);

}  // namespace rlhfd::net
