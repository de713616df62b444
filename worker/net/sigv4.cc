#include "worker/net/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <algorithm>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"

namespace rlhfd::net {
namespace {

std::string HmacSha256(absl::string_view key, absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest, &length);
  return std::string(reinterpret_cast<const char*>(digest), length);
}

}  // namespace

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

std::string UriEncode(absl::string_view text, bool encode_slash) {
  std::string out;
  for (const char c : text) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (c == '/' && !encode_slash)) {
      out.push_back(c);
    } else {
      absl::StrAppend(&out, "%",
                      absl::AsciiStrToUpper(absl::BytesToHexString(absl::string_view(&c, 1))));
    }
  }
  return out;
}

std::string CanonicalQuery(const std::vector<std::pair<std::string, std::string>>& query) {
  std::vector<std::pair<std::string, std::string>> encoded;
  for (const auto& [name, value] : query) {
    encoded.emplace_back(UriEncode(name, true), UriEncode(value, true));
  }
  std::sort(encoded.begin(), encoded.end());
  return absl::StrJoin(encoded, "&", [](std::string* out, const auto& pair) {
    absl::StrAppend(out, pair.first, "=", pair.second);
  });
}

std::string AmzDate(absl::Time time) {
  return absl::FormatTime("%Y%m%dT%H%M%SZ", time, absl::UTCTimeZone());
}

std::vector<std::pair<std::string, std::string>> SignRequest(const SignatureInput& input,
                                                             const AwsCredentials& credentials) {
  std::vector<std::pair<std::string, std::string>> added;
  if (input.content_sha256_header) added.emplace_back("x-amz-content-sha256", input.payload_sha256);
  added.emplace_back("x-amz-date", input.amz_date);
  if (!credentials.session_token.empty()) {
    added.emplace_back("x-amz-security-token", credentials.session_token);
  }
  // Canonical headers: lower-case names, trimmed values with inner runs of spaces as one, sorted.
  std::map<std::string, std::string> canonical = {{"host", input.host}};
  for (const auto& list : {input.headers, added}) {
    for (const auto& [name, value] : list) {
      std::string trimmed(absl::StripAsciiWhitespace(value));
      absl::RemoveExtraAsciiWhitespace(&trimmed);
      canonical[absl::AsciiStrToLower(name)] = trimmed;
    }
  }
  std::string header_block;
  std::vector<std::string> names;
  for (const auto& [name, value] : canonical) {
    absl::StrAppend(&header_block, name, ":", value, "\n");
    names.push_back(name);
  }
  const std::string signed_headers = absl::StrJoin(names, ";");
  const std::string canonical_request =
      absl::StrCat(input.method, "\n", input.path, "\n", CanonicalQuery(input.query), "\n",
                   header_block, "\n", signed_headers, "\n", input.payload_sha256);
  const std::string date = input.amz_date.substr(0, 8);
  const std::string scope =
      absl::StrCat(date, "/", input.region, "/", input.service, "/aws4_request");
  const std::string string_to_sign = absl::StrCat("AWS4-HMAC-SHA256\n", input.amz_date, "\n", scope,
                                                  "\n", Sha256Hex(canonical_request));
  std::string key = HmacSha256(absl::StrCat("AWS4", credentials.secret_access_key), date);
  key = HmacSha256(key, input.region);
  key = HmacSha256(key, input.service);
  key = HmacSha256(key, "aws4_request");
  const std::string signature = absl::BytesToHexString(HmacSha256(key, string_to_sign));
  added.emplace_back(
      "Authorization",
      absl::StrCat("AWS4-HMAC-SHA256 Credential=", credentials.access_key_id, "/", scope,
                   ",SignedHeaders=", signed_headers, ",Signature=", signature));
  return added;
}

}  // namespace rlhfd::net
