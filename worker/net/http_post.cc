#include "worker/net/http_post.h"

#include "absl/strings/str_cat.h"

namespace rlhfd::net {

HttpReply PostJson(const HttpPost& post, const std::string& body, absl::string_view where) {
  HttpReply reply = Perform({.method = "POST",
                             .url = post.url,
                             .headers = {{"Content-Type", "application/json"}},
                             .body = body,
                             .timeout = post.timeout,
                             .stall_timeout = absl::ZeroDuration(),
                             .max_reply_bytes = post.max_reply_bytes,
                             .cancelled = post.cancelled,
                             .timeout_key = post.timeout_key},
                            where);
  // A service's answer is its 200 alone; any other status is the service's refusal.
  if (reply.status.ok() && reply.http_status != 200) {
    reply.status = absl::FailedPreconditionError(absl::StrCat(where, ": HTTP ", reply.http_status));
  } else if (absl::IsNotFound(reply.status)) {
    reply.status = absl::FailedPreconditionError(reply.status.message());
  }
  return reply;
}

}  // namespace rlhfd::net
