// MetricHistory: every job's per-step metrics and logged responses (samples), durable, each step
// once (a step re-run after a recovery replaces its earlier record, samples included). Thread-safe:
// the loop writes while other threads read. An interface, so the store can change; SQLite (WAL
// mode, each write a transaction, each read on a connection of its own so it never holds up a
// write) is what the controller uses. Values are kept as they are, NaN and infinities included
// (common/util/metric_value.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_service.pb.h"

namespace rlhfd::controller {

class MetricHistory {
 public:
  virtual ~MetricHistory() = default;
  // Records (or replaces) `job_id`'s step: its metrics and its samples.
  virtual absl::Status Put(const std::string& job_id, const v1::StepMetrics& step) = 0;
  // The job's steps after `after_step`, oldest first: step, time and metrics (no samples).
  virtual absl::StatusOr<std::vector<v1::StepMetrics>> Get(const std::string& job_id,
                                                           int64_t after_step) = 0;
  // At most this many steps per GetSamples: a step holds up to 2 x 64 samples of two
  // 2,000-byte texts, so one reply stays far below a gRPC message's 64 MiB.
  static constexpr int64_t kMaxSampleSteps = 50;
  // The job's first kMaxSampleSteps steps with samples after `after_step`, oldest first: step,
  // time and samples (no metrics). The next ones come after the last step returned.
  virtual absl::StatusOr<std::vector<v1::StepMetrics>> GetSamples(const std::string& job_id,
                                                                  int64_t after_step) = 0;
  // Forgets the job's steps and samples (DeleteJob).
  virtual absl::Status Remove(const std::string& job_id) = 0;
};

// <state_dir>/metrics.db. DATA_LOSS names the file when it is not a database this controller
// wrote.
absl::StatusOr<std::unique_ptr<MetricHistory>> OpenSqliteMetricHistory(const std::string& path);

}  // namespace rlhfd::controller
