// AWS Signature Version 4 for S3 requests (the Authorization header), as AWS documents it in
// "Signature Calculations for the Authorization Header". Pure functions: tested against AWS's
// published example and botocore.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace rlhfd::net {

struct AwsCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // temporary credentials only
};

struct SignatureInput {
  std::string method;
  std::string host;  // with ":port" when the URL has one
  std::string path;  // URI-encoded, '/' kept: UriEncode(path, false)
  // Query parameters (decoded names and values; encoded and sorted when signing).
  std::vector<std::pair<std::string, std::string>> query;
  // Headers to sign besides host, x-amz-date and x-amz-content-sha256 (and
  // x-amz-security-token with a session token), which are added.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string payload_sha256;         // hex, or "UNSIGNED-PAYLOAD"
  bool content_sha256_header = true;  // S3 wants x-amz-content-sha256; other services do not
  std::string region;
  std::string service = "s3";
  std::string amz_date;  // "YYYYMMDDTHHMMSSZ"
};

// The headers to send (x-amz-date, x-amz-content-sha256, x-amz-security-token when given, and
// Authorization), in order.
std::vector<std::pair<std::string, std::string>> SignRequest(const SignatureInput& input,
                                                             const AwsCredentials& credentials);

// The canonical query string: names and values encoded, sorted by name then value.
std::string CanonicalQuery(const std::vector<std::pair<std::string, std::string>>& query);

// RFC 3986 percent-encoding as SigV4 wants it: unreserved characters kept, '/' kept unless
// `encode_slash`.
std::string UriEncode(absl::string_view text, bool encode_slash);

std::string Sha256Hex(absl::string_view data);

// Time in SigV4's "YYYYMMDDTHHMMSSZ" (UTC).
std::string AmzDate(absl::Time time);

}  // namespace rlhfd::net
