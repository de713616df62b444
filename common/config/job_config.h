// Loading a job config: YAML/JSON text → schema check → defaults → JobSpec → validation.
// Every error is INVALID_ARGUMENT and names the file, the key path and the fix.
#pragma once

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::config {

// Parses and validates config text; `source` (the file name) appears in every error.
absl::StatusOr<v1::JobSpec> ParseJobSpec(absl::string_view text, absl::string_view source);

// Reads `path` and parses it as above.
absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path);

// Applies defaults to a spec built by a program and validates it. Zero-valued fields count as
// unset (proto3 cannot tell them apart) and take their defaults.
absl::StatusOr<v1::JobSpec> CompleteJobSpec(const v1::JobSpec& spec, absl::string_view source);

}  // namespace rlhfd::config
