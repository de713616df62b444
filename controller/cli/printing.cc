#include "controller/cli/printing.h"

#include <google/protobuf/util/json_util.h>

#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config/job_validator.h"
#include "common/config/proto_json_schema.h"
#include "common/util/clock.h"
#include "common/util/metric_value.h"

namespace rlhfd::cli {

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

std::string ShortEnum(const google::protobuf::EnumDescriptor* type, int value) {
  const auto* descriptor = type->FindValueByNumber(value);
  return descriptor ? config::EnumConfigName(*descriptor) : absl::StrCat(value);
}

std::string Bytes(int64_t bytes) {
  if (bytes < 0) return "-";
  return absl::StrFormat("%.1f GiB", bytes / double(1 << 30));
}

std::string Ago(int64_t time_ms) {
  if (time_ms <= 0) return "-";
  const int64_t seconds = (NowUnixMillis() - time_ms) / 1000;
  if (seconds < 120) return absl::StrCat(seconds, "s ago");
  if (seconds < 7200) return absl::StrCat(seconds / 60, "m ago");
  return absl::StrCat(seconds / 3600, "h ago");
}

void PrintJob(const v1::Job& job) {
  std::cout << "job:      " << job.job_id() << "\n"
            << "name:     " << job.spec().name() << "\n"
            << "state:    " << ShortEnum(v1::JobState_descriptor(), job.state()) << "\n"
            << "message:  " << job.message() << "\n"
            << "source:   " << job.source() << "\n"
            << "model:    " << job.spec().model().path() << "\n"
            << "gpus:     " << config::TotalGpus(job.spec()) << "\n"
            << "submitted " << Ago(job.submit_time_ms()) << ", updated "
            << Ago(job.update_time_ms()) << "\n";
  const v1::JobProgress& progress = job.progress();
  if (progress.total_steps() > 0) {
    std::cout << "step:     " << progress.current_step() << " of " << progress.total_steps();
    if (progress.step_time_s() > 0) {
      std::cout << absl::StrFormat(" (%.2f s per step)", progress.step_time_s());
    }
    std::cout << "\n";
  }
  if (progress.checkpoint_step() > 0) {
    std::cout << "checkpoint: step " << progress.checkpoint_step() << " in "
              << job.spec().trainer().checkpoint_dir() << "\n";
  }
  for (const v1::RolePlacement& role : job.placement()) {
    std::cout << absl::StrFormat("%-9s %s\n", role.role() + ":",
                                 absl::StrJoin(role.worker_ids(), ", "));
  }
  if (progress.restarts() > 0) {
    std::cout << "restarts: " << progress.restarts() << "\n";
    for (const std::string& cause : progress.restart_causes()) std::cout << "  - " << cause << "\n";
  }
}

std::string KeyMetrics(const google::protobuf::Map<std::string, double>& metrics) {
  std::vector<std::string> shown;
  for (const char* name : kKeyMetrics) {
    const auto found = metrics.find(name);
    if (found != metrics.end())
      shown.push_back(absl::StrCat(name, "=", FormatMetric(found->second, 4)));
  }
  for (const auto& [name, value] : metrics) {
    if (absl::StartsWith(name, "val"))
      shown.push_back(absl::StrCat(name, "=", FormatMetric(value, 4)));
  }
  return absl::StrJoin(shown, " ");
}

std::vector<std::string> MetricsRow(const v1::StepMetrics& step) {
  std::vector<std::string> row = {std::to_string(step.step())};
  for (const char* name : kKeyMetrics) {
    const auto found = step.metrics().find(name);
    row.push_back(found == step.metrics().end() ? "" : FormatMetric(found->second, 4));
  }
  return row;
}

}  // namespace rlhfd::cli
