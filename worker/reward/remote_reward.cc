#include "worker/reward/remote_reward.h"

#include <curl/curl.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "common/util/text.h"

namespace rlhfd::reward {
namespace {

using nlohmann::json;

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

// What one attempt ended with: a status, and whether another attempt may help.
struct Attempt {
  absl::Status status;
  bool retryable = false;
  std::string body;
};

std::string Excerpt(const std::string& body) { return SanitizeForDisplay(body, 200); }

}  // namespace

RemoteReward::RemoteReward(RemoteRewardOptions options) : options_(std::move(options)) {
  InitializeCurlOnce();
}

absl::StatusOr<std::vector<double>> RemoteReward::Score(const RemoteRewardRequest& request,
                                                        const std::atomic<bool>* cancelled) const {
  const size_t count = request.queries.size();
  if (request.prompts.size() != count || request.labels.size() != count ||
      request.responses.size() != count || request.data_sources.size() != count ||
      request.extra_infos.size() != count) {
    return absl::InternalError(
        "remote reward: queries, prompts, labels, responses, data_sources and extra_infos differ "
        "in length");
  }
  if (count == 0) return std::vector<double>();
  const json payload = {{"query", request.queries},
                        {"prompts", request.prompts},
                        {"labels", request.labels},
                        {"responses", request.responses},
                        {"data_sources", request.data_sources},
                        {"extra_infos", request.extra_infos}};
  const std::string body = payload.dump(-1, ' ', false, json::error_handler_t::replace);
  const std::string where = absl::StrCat("remote reward ", SanitizeForDisplay(options_.url, 200));

  const auto attempt_once = [&]() -> Attempt {
    std::unique_ptr<CURL, CurlDeleter> curl(curl_easy_init());
    if (!curl) return {absl::InternalError(absl::StrCat(where, ": curl_easy_init failed")), false};
    std::unique_ptr<curl_slist, HeaderListDeleter> headers(
        curl_slist_append(nullptr, "Content-Type: application/json"));
    ReplyBuffer reply{.limit = options_.max_reply_bytes};
    char error_text[CURL_ERROR_SIZE] = {0};
    curl_easy_setopt(curl.get(), CURLOPT_URL, options_.url.c_str());
    curl_easy_setopt(curl.get(), CURLOPT_HTTPHEADER, headers.get());
    curl_easy_setopt(curl.get(), CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(curl.get(), CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(curl.get(), CURLOPT_TIMEOUT_MS,
                     static_cast<long>(absl::ToInt64Milliseconds(options_.timeout)));
    curl_easy_setopt(curl.get(), CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for DNS timeouts
    curl_easy_setopt(curl.get(), CURLOPT_WRITEFUNCTION, AppendReply);
    curl_easy_setopt(curl.get(), CURLOPT_WRITEDATA, &reply);
    curl_easy_setopt(curl.get(), CURLOPT_ERRORBUFFER, error_text);
    curl_easy_setopt(curl.get(), CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl.get(), CURLOPT_XFERINFOFUNCTION, CheckCancelled);
    curl_easy_setopt(curl.get(), CURLOPT_XFERINFODATA, cancelled);
    curl_easy_setopt(curl.get(), CURLOPT_NOPROGRESS, 0L);
    const CURLcode code = curl_easy_perform(curl.get());
    if (code == CURLE_ABORTED_BY_CALLBACK) {
      return {absl::CancelledError(absl::StrCat(where, ": cancelled")), false};
    }
    if (code == CURLE_WRITE_ERROR && reply.truncated) {
      return {absl::InvalidArgumentError(absl::StrCat(where, ": the reply is longer than ",
                                                      options_.max_reply_bytes, " bytes")),
              false};
    }
    if (code == CURLE_OPERATION_TIMEDOUT) {
      return {absl::DeadlineExceededError(absl::StrCat(
                  where, ": no complete answer within ", absl::FormatDuration(options_.timeout),
                  " (roles.reward.remote_timeout_s)")),
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
          absl::StrCat(where, ": HTTP ", http_status, ": ", Excerpt(reply.body));
      return {retryable ? absl::UnavailableError(text) : absl::FailedPreconditionError(text),
              retryable};
    }
    return {absl::OkStatus(), false, std::move(reply.body)};
  };

  Attempt attempt;
  absl::Duration backoff = options_.first_backoff;
  for (int number = 1; number <= options_.max_attempts; ++number) {
    attempt = attempt_once();
    if (attempt.status.ok() || !attempt.retryable || number == options_.max_attempts) break;
    RLOG(WARNING) << attempt.status.message() << "; attempt " << number << " of "
                  << options_.max_attempts << ", retrying in " << absl::FormatDuration(backoff);
    for (absl::Time until = absl::Now() + backoff; absl::Now() < until;) {
      if (cancelled != nullptr && cancelled->load()) return absl::CancelledError(where);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    backoff *= 2;
  }
  if (!attempt.status.ok()) {
    if (attempt.retryable && options_.max_attempts > 1) {
      return absl::Status(attempt.status.code(),
                          absl::StrCat(attempt.status.message(), " (after ",
                                       options_.max_attempts, " attempts)"));
    }
    return attempt.status;
  }

  const json reply = json::parse(attempt.body, nullptr, /*allow_exceptions=*/false);
  if (reply.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": the reply is not JSON: ", Excerpt(attempt.body)));
  }
  const auto rewards = reply.is_object() ? reply.find("rewards") : reply.end();
  if (!reply.is_object() || rewards == reply.end() || !rewards->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": the reply has no \"rewards\" list (expected {\"rewards\": [...]}): ",
        Excerpt(attempt.body)));
  }
  if (rewards->size() != count) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", rewards->size(),
                                                   " rewards for ", count, " queries"));
  }
  std::vector<double> scores;
  scores.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const json& value = (*rewards)[i];
    if (!value.is_number() || !std::isfinite(value.get<double>())) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": rewards[", i,
                                                     "] is not a finite number: ",
                                                     Excerpt(value.dump())));
    }
    scores.push_back(value.get<double>());
  }
  return scores;
}

}  // namespace rlhfd::reward
