// Semantic checks of a JobSpec after defaults: ranges, and consistency between sections (GPU
// counts vs layouts, batch divisibility, estimator vs roles). Each error says what to change.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "common/config/config_errors.h"
#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::config {

// Fills derived defaults (train dp = gpus / tp; role GPUs by placement; the KL estimator by the
// KL mode; the experiment name), adding each filled key path to `derived` when given, then
// validates.
void CompleteAndValidateJobSpec(v1::JobSpec* spec, ConfigErrors* errors,
                                std::set<std::string>* derived = nullptr);

// GPUs the job needs: the actor's alone when colocated, the sum over pools when split.
int TotalGpus(const v1::JobSpec& spec);

}  // namespace rlhfd::config
