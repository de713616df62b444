#include "worker/reward/remote_reward.h"

#include <cmath>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "common/util/text.h"
#include "worker/net/http_post.h"

namespace rlhfd::reward {
namespace {

using nlohmann::json;

std::string Excerpt(const std::string& body) { return SanitizeForDisplay(body, 200); }

}  // namespace

RemoteReward::RemoteReward(RemoteRewardOptions options) : options_(std::move(options)) {}

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

  const net::HttpPost post{.url = options_.url,
                           .timeout = options_.timeout,
                           .max_reply_bytes = options_.max_reply_bytes,
                           .cancelled = cancelled,
                           .timeout_key = "roles.reward.remote_timeout_s"};
  net::HttpReply attempt;
  absl::Duration backoff = options_.first_backoff;
  for (int number = 1; number <= options_.max_attempts; ++number) {
    attempt = net::PostJson(post, body, where);
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
