#include "worker/net/http_post.h"

#include <curl/curl.h>

#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/util/text.h"

namespace rlhfd::net {
namespace {

void InitializeCurlOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct CurlDeleter {
  void operator()(CURL* handle) const { curl_easy_cleanup(handle); }
};
struct HeaderListDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};

struct ReplyBuffer {
  std::string body;
  size_t limit = 0;
  bool truncated = false;
};

size_t AppendReply(char* data, size_t size, size_t count, void* user) {
  auto* reply = static_cast<ReplyBuffer*>(user);
  const size_t bytes = size * count;
  if (reply->body.size() + bytes > reply->limit) {
    reply->truncated = true;
    return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
  }
  reply->body.append(data, bytes);
  return bytes;
}

int CheckCancelled(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto* cancelled = static_cast<const std::atomic<bool>*>(user);
  return cancelled != nullptr && cancelled->load() ? 1 : 0;
}

}  // namespace

HttpReply PostJson(const HttpPost& post, const std::string& body, absl::string_view where) {
  InitializeCurlOnce();
  std::unique_ptr<CURL, CurlDeleter> curl(curl_easy_init());
  if (!curl) return {absl::InternalError(absl::StrCat(where, ": curl_easy_init failed")), false};
  std::unique_ptr<curl_slist, HeaderListDeleter> headers(
      curl_slist_append(nullptr, "Content-Type: application/json"));
  ReplyBuffer reply{.limit = post.max_reply_bytes};
  char error_text[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl.get(), CURLOPT_URL, post.url.c_str());
  curl_easy_setopt(curl.get(), CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(curl.get(), CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(curl.get(), CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(curl.get(), CURLOPT_TIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(post.timeout)));
  curl_easy_setopt(curl.get(), CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for DNS timeouts
  curl_easy_setopt(curl.get(), CURLOPT_WRITEFUNCTION, AppendReply);
  curl_easy_setopt(curl.get(), CURLOPT_WRITEDATA, &reply);
  curl_easy_setopt(curl.get(), CURLOPT_ERRORBUFFER, error_text);
  curl_easy_setopt(curl.get(), CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl.get(), CURLOPT_XFERINFOFUNCTION, CheckCancelled);
  curl_easy_setopt(curl.get(), CURLOPT_XFERINFODATA, post.cancelled);
  curl_easy_setopt(curl.get(), CURLOPT_NOPROGRESS, 0L);
  const CURLcode code = curl_easy_perform(curl.get());
  if (code == CURLE_ABORTED_BY_CALLBACK) {
    return {absl::CancelledError(absl::StrCat(where, ": cancelled")), false};
  }
  if (code == CURLE_WRITE_ERROR && reply.truncated) {
    return {absl::InvalidArgumentError(
                absl::StrCat(where, ": the reply is longer than ", post.max_reply_bytes, " bytes")),
            false};
  }
  if (code == CURLE_OPERATION_TIMEDOUT) {
    return {absl::DeadlineExceededError(absl::StrCat(
                where, ": no complete answer within ", absl::FormatDuration(post.timeout),
                post.timeout_key.empty() ? "" : absl::StrCat(" (", post.timeout_key, ")"))),
            true};
  }
  if (code != CURLE_OK) {
    return {absl::UnavailableError(absl::StrCat(
                where, ": ", error_text[0] != '\0' ? error_text : curl_easy_strerror(code))),
            true};
  }
  long http_status = 0;
  curl_easy_getinfo(curl.get(), CURLINFO_RESPONSE_CODE, &http_status);
  if (http_status != 200) {
    const bool retryable = http_status == 429 || http_status >= 500;
    const std::string text =
        absl::StrCat(where, ": HTTP ", http_status, ": ", SanitizeForDisplay(reply.body, 200));
    return {retryable ? absl::UnavailableError(text) : absl::FailedPreconditionError(text),
            retryable, std::move(reply.body)};
  }
  return {absl::OkStatus(), false, std::move(reply.body)};
}

}  // namespace rlhfd::net
