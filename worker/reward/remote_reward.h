// A remote scoring service in OpenRLHF's protocol (its remote_rm_url): one HTTP POST of
//   {"query": [prompt + response, ...], "prompts": [prompt, ...], "labels": [ground truth, ...],
//    "responses": [response, ...], "data_sources": [...], "extra_infos": [object or null, ...]}
// answered by {"rewards": [number, ...]}, one per query. The last three lists carry what a verl
// compute_score takes (docs/rewards.md); a service that knows only OpenRLHF's keys ignores them.
// Each attempt has a deadline; connection failures, deadlines, HTTP 429 and 5xx are retried a
// bounded number of times with doubling backoff; anything else fails at once. Every error names the
// URL and what came back.
#pragma once

#include <atomic>
#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace rlhfd::reward {

struct RemoteRewardOptions {
  std::string url;  // http:// or https://
  absl::Duration timeout = absl::Seconds(30);  // per attempt, connecting included
  int max_attempts = 3;
  absl::Duration first_backoff = absl::Milliseconds(250);
  size_t max_reply_bytes = 16 << 20;
};

struct RemoteRewardRequest {
  std::vector<std::string> queries;  // prompt + response
  std::vector<std::string> prompts;
  std::vector<nlohmann::json> labels;  // ground truths as the data holds them
  std::vector<std::string> responses;  // the decoded responses alone
  std::vector<std::string> data_sources;
  std::vector<nlohmann::json> extra_infos;  // each row's extra_info object, or null
};

class RemoteReward {
 public:
  explicit RemoteReward(RemoteRewardOptions options);

  // One reward per query. UNAVAILABLE / DEADLINE_EXCEEDED after the last failed attempt,
  // INVALID_ARGUMENT (malformed reply, wrong count, a non-number) or FAILED_PRECONDITION (HTTP
  // 4xx) at once; CANCELLED when `cancelled` turns true during a call.
  absl::StatusOr<std::vector<double>> Score(const RemoteRewardRequest& request,
                                            const std::atomic<bool>* cancelled = nullptr) const;

 private:
  RemoteRewardOptions options_;
};

}  // namespace rlhfd::reward
