// What the controller checks of a job's files when it is submitted, so that a missing model or
// data file is an error at once instead of a failure hours later on a worker: relative paths
// resolved against the submitter's directory, model directories complete (config.json,
// tokenizer.json, weights), data files present and JSONL.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::controller {

// Makes every path of `spec` absolute against `base_dir` (itself absolute, or empty: then the
// paths must be absolute already), then checks the files. One INVALID_ARGUMENT lists every
// problem, each naming `source` and the key.
absl::Status ResolveAndCheckFiles(const std::string& base_dir, const std::string& source,
                                  v1::JobSpec* spec);

}  // namespace rlhfd::controller
