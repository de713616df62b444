// CallMetrics: counts and latency histograms of the controller's API calls (gRPC and REST), by
// method and status code, for /metrics. Thread-safe: RPC threads, the event loop and the
// gateway's threads record; /metrics reads. main() makes the one instance and hands it to the
// gRPC adapters (ServiceContext) and the REST gateway.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace rlhfd::controller {

class CallMetrics {
 public:
  // One call of `method` ("grpc/GetJob", "rest/GET /v1/jobs/{id}") that ended with `code` (a
  // gRPC code's name, or an HTTP status) after `latency`.
  void Record(const std::string& method, const std::string& code, absl::Duration latency);

  // Prometheus text: rlhfd_api_calls_total{method,code} and the histogram
  // rlhfd_api_call_seconds{method}.
  std::string PrometheusText() const;

 private:
  // Upper bounds of the latency buckets, in seconds (the last, +Inf, is implied).
  static constexpr std::array<double, 10> kBuckets = {0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                      0.025,  0.05,  0.1,    0.25,  1.0};
  struct Histogram {
    std::array<int64_t, kBuckets.size()> below{};  // cumulative counts are computed when read
    int64_t count = 0;
    double sum = 0;
  };
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, std::string>, int64_t> calls_;  // (method, code) -> count
  std::map<std::string, Histogram> latency_;
};

}  // namespace rlhfd::controller
