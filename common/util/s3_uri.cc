#include "common/util/s3_uri.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace rlhfd {
namespace {

bool IsBucketCharacter(char c) {
  return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '.' || c == '-';
}

// S3's "safe characters" for object keys: nothing that needs care in a URL or a shell.
bool IsSafeKeyCharacter(char c) {
  return absl::ascii_isalnum(c) || absl::StrContains("!-_.*'()/", c);
}

}  // namespace

absl::StatusOr<S3Location> ParseS3Uri(absl::string_view uri) {
  absl::string_view rest = uri;
  if (!absl::ConsumePrefix(&rest, "s3://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", uri, "' is not an s3:// URI (give s3://<bucket>/<prefix>)"));
  }
  const size_t slash = rest.find('/');
  S3Location location;
  location.bucket = std::string(rest.substr(0, slash));
  const std::string& bucket = location.bucket;
  const bool bucket_ok = bucket.size() >= 3 && bucket.size() <= 63 &&
                         std::all_of(bucket.begin(), bucket.end(), IsBucketCharacter) &&
                         absl::ascii_isalnum(bucket.front()) && absl::ascii_isalnum(bucket.back());
  if (!bucket_ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", bucket, "' is not a valid S3 bucket name (3-63 lowercase letters, ",
                     "digits, '.' or '-', starting and ending with a letter or digit)"));
  }
  absl::string_view prefix = slash == absl::string_view::npos ? "" : rest.substr(slash + 1);
  while (absl::ConsumeSuffix(&prefix, "/")) {
  }
  for (const char c : prefix) {
    if (!IsSafeKeyCharacter(c)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the prefix '", prefix, "' holds '", std::string(1, c),
          "': use letters, digits and ! - _ . * ' ( ) / (S3's safe characters for keys)"));
    }
  }
  for (const absl::string_view segment : absl::StrSplit(prefix, '/')) {
    if (!prefix.empty() && (segment.empty() || segment == "." || segment == "..")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the prefix '", prefix, "' has an empty, '.' or '..' path segment (URLs drop them)"));
    }
  }
  location.prefix = std::string(prefix);
  return location;
}

std::string S3Key(const S3Location& location, absl::string_view relative) {
  return location.prefix.empty() ? std::string(relative)
                                 : absl::StrCat(location.prefix, "/", relative);
}

}  // namespace rlhfd
