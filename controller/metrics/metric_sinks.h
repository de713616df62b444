// Where a job's per-step metrics go besides the history (trainer.loggers), written by the
// controller as verl's trackers write them:
//   console      one readable line per step in the controller's log
//   jsonl        <dir>/metrics.jsonl, verl's file logger: {"step": N, "data": {name: value}}
//   tensorboard  <dir>/tensorboard/events.out.tfevents.<seconds>.<host>: TFRecord framing
//                (masked CRC32C) of Event protos with one scalar summary value per metric
// `dir` is the job's log directory (--log_dir/<job id>).
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
  virtual absl::Status Write(const v1::StepMetrics& step) = 0;
};

// The sinks `loggers` name (unknown names were refused by the validator; INVALID_ARGUMENT here),
// writing under `dir` (made when a file sink needs it).
absl::StatusOr<std::vector<std::unique_ptr<MetricSink>>> MakeMetricSinks(
    const std::string& job_id, const std::vector<std::string>& loggers, const std::string& dir);

// TFRecord's masked form of a CRC-32C (common/util/crc32c.h).
uint32_t MaskCrc32c(uint32_t crc);

}  // namespace rlhfd::controller
