// "s3://<bucket>/<prefix>" as trainer.checkpoint_uri gives it: checked by the validator at
// submission and split by the worker that uploads. One parser for both.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rlhfd {

struct S3Location {
  std::string bucket;
  std::string prefix;  // without leading or trailing '/'; may be empty
};

// INVALID_ARGUMENT saying what to fix: another scheme, a bucket name S3 refuses (3-63 of
// a-z 0-9 . -, starting and ending with a letter or digit), or a prefix with characters outside
// S3's safe set (letters, digits, and ! - _ . * ' ( ) /) or an empty, "." or ".." segment.
absl::StatusOr<S3Location> ParseS3Uri(absl::string_view uri);

// The key of `relative` ("step_3/commit.json") under the location's prefix.
std::string S3Key(const S3Location& location, absl::string_view relative);

}  // namespace rlhfd
