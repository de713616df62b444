// Loading a job config: YAML/JSON text → overrides → schema check → defaults → JobSpec →
// validation. Every error is INVALID_ARGUMENT and names the file, the key path and the fix; all
// of a config's problems are reported together.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/config/config_errors.h"
#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::config {

// A loaded config with what `rlhfctl validate` shows about it.
struct LoadedConfig {
  v1::JobSpec spec;
  // Dotted key paths whose value came from the defaults, and those computed from other keys
  // (train dp, role GPUs, the KL estimator, the experiment name).
  std::set<std::string> defaulted;
  std::set<std::string> derived;
};

// Parses `text` (empty: an empty mapping), applies `overrides` (overrides.h), and validates.
// `source` (the file name) appears in every error.
absl::StatusOr<LoadedConfig> LoadConfig(absl::string_view text, absl::string_view source,
                                        const std::vector<std::string>& overrides = {});

// LoadConfig for callers that check more of the job (the files it names) and report everything
// at once: every problem goes to `errors`, and a config with problems still yields its spec (a
// refused value replaced by its default) for the further checks. nullopt only when the text does
// not parse (a YAML syntax error; a bad override is one problem among the others): nothing more
// can be checked.
std::optional<LoadedConfig> LoadConfigCollectingErrors(absl::string_view text,
                                                       absl::string_view source,
                                                       const std::vector<std::string>& overrides,
                                                       ConfigErrors* errors);

// LoadConfig's spec.
absl::StatusOr<v1::JobSpec> ParseJobSpec(absl::string_view text, absl::string_view source,
                                         const std::vector<std::string>& overrides = {});

// Reads `path` and parses it as above.
absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path);

// Applies defaults to a spec built by a program and validates it. Zero-valued fields count as
// unset (proto3 cannot tell them apart) and take their defaults.
absl::StatusOr<v1::JobSpec> CompleteJobSpec(const v1::JobSpec& spec, absl::string_view source);

}  // namespace rlhfd::config
