// What the controller checks of a job's files when it is submitted, so that a missing model or
// data file is an error at once instead of a failure hours later on a worker: relative paths
// resolved against the submitter's directory, model directories complete (config.json,
// tokenizer.json, weights, an architecture the workers run), data files present and readable
// (a JSONL file's first line, a Parquet file's metadata and first row: prompt_data.h).
#pragma once

#include <string>

#include "common/config/config_errors.h"
#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::controller {

// Makes every path of `spec` absolute against `base_dir` (itself absolute, or empty: then the
// paths must be absolute already), then checks the files, adding each problem (naming the key)
// to `problems` after those the config check found there: a spec with config errors is still
// checked, so that one answer lists everything. A key `problems` names already is left alone.
void ResolveAndCheckFiles(const std::string& base_dir, v1::JobSpec* spec,
                          config::ConfigErrors* problems);

// A warning for a job that runs but slowly: a tensor-parallel rollout on GPUs of a model whose
// head dim the fused decode does not serve (64 and 128), which then recomputes every sample's
// whole prefix per token. Empty otherwise (or when the model's config.json cannot be read: the
// file checks say so).
std::string SlowRolloutWarning(const v1::JobSpec& spec);

}  // namespace rlhfd::controller
