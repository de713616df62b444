#include "controller/metrics/call_metrics.h"

#include "absl/strings/str_cat.h"

namespace rlhfd::controller {

void CallMetrics::Record(const std::string& method, const std::string& code,
                         absl::Duration latency) {
  const double seconds = absl::ToDoubleSeconds(latency);
  std::lock_guard<std::mutex> lock(mutex_);
  ++calls_[{method, code}];
  Histogram& histogram = latency_[method];
  for (size_t i = 0; i < kBuckets.size(); ++i) {
    if (seconds <= kBuckets[i]) {
      ++histogram.below[i];
      break;
    }
  }
  ++histogram.count;
  histogram.sum += seconds;
}

std::string CallMetrics::PrometheusText() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out =
      "# HELP rlhfd_api_calls_total API calls (gRPC and REST) by method and status code.\n"
      "# TYPE rlhfd_api_calls_total counter\n";
  for (const auto& [key, count] : calls_) {
    absl::StrAppend(&out, "rlhfd_api_calls_total{method=\"", key.first, "\",code=\"", key.second,
                    "\"} ", count, "\n");
  }
  absl::StrAppend(&out,
                  "# HELP rlhfd_api_call_seconds API call latency, arrival to answer.\n"
                  "# TYPE rlhfd_api_call_seconds histogram\n");
  for (const auto& [method, histogram] : latency_) {
    int64_t cumulative = 0;
    for (size_t i = 0; i < kBuckets.size(); ++i) {
      cumulative += histogram.below[i];
      absl::StrAppend(&out, "rlhfd_api_call_seconds_bucket{method=\"", method, "\",le=\"",
                      kBuckets[i], "\"} ", cumulative, "\n");
    }
    absl::StrAppend(&out, "rlhfd_api_call_seconds_bucket{method=\"", method, "\",le=\"+Inf\"} ",
                    histogram.count, "\n", "rlhfd_api_call_seconds_sum{method=\"", method, "\"} ",
                    histogram.sum, "\n", "rlhfd_api_call_seconds_count{method=\"", method, "\"} ",
                    histogram.count, "\n");
  }
  return out;
}

}  // namespace rlhfd::controller
