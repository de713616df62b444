// How rlhfctl shows things to people: protos as JSON (--json), enum values as config names,
// sizes, ages, a job's record, and the key metrics of a step.
#pragma once

#include <google/protobuf/message.h>

#include <cstdint>
#include <string>
#include <vector>

#include "rlhfd/v1/job_service.pb.h"

namespace rlhfd::cli {

std::string ToJson(const google::protobuf::Message& message);
// The config name of an enum value ("running" for JOB_STATE_RUNNING).
std::string ShortEnum(const google::protobuf::EnumDescriptor* type, int value);
std::string Bytes(int64_t bytes);
// "42s ago", "3m ago", "5h ago"; "-" for no time.
std::string Ago(int64_t time_ms);

void PrintJob(const v1::Job& job);

// The metrics a person follows a run by (all of them with --json).
inline constexpr const char* kKeyMetrics[] = {"critic/score/mean",    "actor/pg_loss",
                                              "actor/kl_loss",        "actor/entropy",
                                              "response_length/mean", "timing_s/step"};

// The key metrics and the validation ones, as name=value.
std::string KeyMetrics(const google::protobuf::Map<std::string, double>& metrics);
// A step's number and its key metrics, for a table row.
std::vector<std::string> MetricsRow(const v1::StepMetrics& step);

}  // namespace rlhfd::cli
