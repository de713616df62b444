// Where a job's per-step metrics go besides the history (trainer.loggers), written by the
// controller as verl's trackers write them:
//   console      one readable line per step in the controller's log, and one per logged
//                response (trainer.log_samples: prompt, response, score)
//   jsonl        <dir>/metrics.jsonl, verl's file logger: {"step": N, "data": {name: value}};
//                <dir>/samples.jsonl: a line per logged response
//   tensorboard  <dir>/tensorboard/events.out.tfevents.<seconds>.<host>: TFRecord framing
//                (masked CRC32C) of Event protos with one scalar summary value per metric, and
//                the logged responses as text summaries (samples/train, samples/val)
// `dir` is the job's log directory (--log_dir/<job id>). NaN and infinities are written as such:
// JSON as "NaN" / "Infinity" / "-Infinity" (common/util/metric_value.h), TensorBoard as floats.
//
// Each step once: a run of a job that resumes after step K re-runs the steps after K, so before
// it writes, StartRun drops what an earlier run wrote of them (metrics.jsonl and samples.jsonl
// are cut after their last line of a step <= K; TensorBoard gets a SessionLog START at step
// K + 1, which its readers take as "discard every event from this step on").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_service.pb.h"

namespace rlhfd::controller {

class MetricSink {
 public:
  virtual ~MetricSink() = default;
  // Before the run's first Write: the run goes on after step `resumed_after` (0: from the start,
  // validation before training included), so earlier runs' records of later steps go.
  virtual absl::Status StartRun(int64_t resumed_after) = 0;
  virtual absl::Status Write(const v1::StepMetrics& step) = 0;
};

// The sinks `loggers` name (unknown names were refused by the validator; INVALID_ARGUMENT here),
// writing under `dir` (made when a file sink needs it).
absl::StatusOr<std::vector<std::unique_ptr<MetricSink>>> MakeMetricSinks(
    const std::string& job_id, const std::vector<std::string>& loggers, const std::string& dir);

// TFRecord's masked form of a CRC-32C (common/util/crc32c.h).
uint32_t MaskCrc32c(uint32_t crc);

}  // namespace rlhfd::controller
