// Token creation, lookup and checking.
#include "common/rpc/auth.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"

namespace rlhfd {
namespace {

constexpr char kBearerPrefix[] = "Bearer ";

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::StatusOr<std::string> GenerateToken() {
  char bytes[32];
  size_t filled = 0;
  while (filled < sizeof(bytes)) {
    ssize_t n = ::getrandom(bytes + filled, sizeof(bytes) - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("getrandom failed: ", std::strerror(errno)));
    }
    filled += n;
  }
  return absl::BytesToHexString(absl::string_view(bytes, sizeof(bytes)));
}

absl::StatusOr<std::string> LoadOrCreateToken(const std::string& state_dir,
                                              const std::string& file) {
  const std::string path = absl::StrCat(state_dir, "/", file);
  auto existing = ReadFileToString(path, 4096);
  if (existing.ok()) {
    std::string token(absl::StripAsciiWhitespace(*existing));
    if (token.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " is empty; delete it to have a new token created"));
    }
    return token;
  }
  if (!absl::IsNotFound(existing.status())) return existing.status();
  RETURN_IF_ERROR(MakeDirectories(state_dir, 0700));
  ASSIGN_OR_RETURN(std::string token, GenerateToken());
  RETURN_IF_ERROR(WriteFileAtomically(path, token + "\n", 0600));
  return token;
}

absl::StatusOr<std::string> ResolveClientToken(const std::string& token,
                                               const std::string& token_file) {
  if (!token.empty()) return token;
  if (const char* env = std::getenv("RLHFD_TOKEN"); env != nullptr && *env != '\0') return env;
  std::string file = token_file;
  if (file.empty()) {
    if (const char* env = std::getenv("RLHFD_TOKEN_FILE"); env != nullptr) file = env;
  }
  if (file.empty()) {
    return absl::UnauthenticatedError(
        "no token: pass --token_file=<controller state dir>/token, --token, or set "
        "RLHFD_TOKEN / RLHFD_TOKEN_FILE");
  }
  auto contents = ReadFileToString(file, 4096);
  if (!contents.ok()) {
    return absl::Status(contents.status().code(),
                        absl::StrCat("cannot read the token: ", contents.status().message()));
  }
  std::string stripped(absl::StripAsciiWhitespace(*contents));
  if (stripped.empty()) return absl::UnauthenticatedError(absl::StrCat(file, " is empty"));
  return stripped;
}

void AttachToken(grpc::ClientContext* context, const std::string& token) {
  // gRPC aborts the process on a header value outside printable ASCII, so a token read from a
  // file with a newline (or worse) is trimmed, and one that still is not a header value is not
  // sent: the server then answers UNAUTHENTICATED, which says what to fix.
  const absl::string_view trimmed = absl::StripAsciiWhitespace(token);
  for (char c : trimmed) {
    if (c < 0x20 || c > 0x7E) return;
  }
  context->AddMetadata("authorization", absl::StrCat(kBearerPrefix, trimmed));
}

namespace {

constexpr char kMissingToken[] =
    "missing bearer token: pass --token_file=<controller state dir>/token (or read_token to "
    "read only) or set RLHFD_TOKEN (HTTP: an 'Authorization: Bearer <token>' header)";

// The token of a "Bearer <token>" header value; UNAUTHENTICATED if there is none. The scheme's
// name is case-insensitive (RFC 9110 11.1): "bearer" and "BEARER" are the same scheme.
absl::StatusOr<absl::string_view> BearerOf(const std::string* authorization) {
  if (authorization == nullptr) return absl::UnauthenticatedError(kMissingToken);
  const absl::string_view value(*authorization);
  if (!absl::StartsWithIgnoreCase(value, kBearerPrefix)) {
    return absl::UnauthenticatedError("the authorization header is not 'Bearer <token>'");
  }
  return value.substr(sizeof(kBearerPrefix) - 1);
}

// The token of a bearer header, or the password of HTTP Basic credentials.
absl::StatusOr<std::string> HttpTokenOf(const std::string* authorization) {
  constexpr absl::string_view kBasicPrefix = "Basic ";
  if (authorization == nullptr || !absl::StartsWithIgnoreCase(*authorization, kBasicPrefix)) {
    ASSIGN_OR_RETURN(absl::string_view bearer, BearerOf(authorization));
    return std::string(bearer);
  }
  std::string credentials;
  if (!absl::Base64Unescape(absl::string_view(*authorization).substr(kBasicPrefix.size()),
                            &credentials)) {
    return absl::UnauthenticatedError("the Basic credentials are not base64");
  }
  const size_t colon = credentials.find(':');
  if (colon == std::string::npos) {
    return absl::UnauthenticatedError(
        "wrong token: the Basic credentials are not 'user:password' (the token is the password)");
  }
  return credentials.substr(colon + 1);
}

// Both tokens are compared, so the time taken does not tell which one a guess came close to.
absl::Status Grant(absl::string_view presented, const ClientTokens& tokens, Access needed) {
  const bool admin = ConstantTimeEquals(presented, tokens.admin);
  const bool reader = !tokens.read_only.empty() && ConstantTimeEquals(presented, tokens.read_only);
  if (admin || (reader && needed == Access::kRead)) return absl::OkStatus();
  if (reader) {
    return absl::PermissionDeniedError(
        "this is the read-only token (read_token): it reads jobs, workers and metrics; use the "
        "admin token (<controller state dir>/token) to submit, cancel or drain");
  }
  return absl::UnauthenticatedError(
      "wrong bearer token: use the token (or read_token) in the controller's state dir");
}

const std::string* AuthorizationOf(const grpc::ServerContextBase& context, std::string& value) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return nullptr;
  value.assign(it->second.data(), it->second.size());
  return &value;
}

}  // namespace

grpc::Status CheckToken(const grpc::ServerContextBase& context, const std::string& expected,
                        const std::string& what) {
  std::string value;
  const absl::StatusOr<absl::string_view> presented = BearerOf(AuthorizationOf(context, value));
  if (!presented.ok()) return ToGrpcStatus(presented.status());
  if (expected.empty() || !ConstantTimeEquals(*presented, expected)) {
    return ToGrpcStatus(absl::UnauthenticatedError(absl::StrCat("wrong bearer token: ", what)));
  }
  return grpc::Status::OK;
}

grpc::Status CheckAccess(const grpc::ServerContextBase& context, const ClientTokens& tokens,
                         Access needed) {
  std::string value;
  const absl::StatusOr<absl::string_view> presented = BearerOf(AuthorizationOf(context, value));
  if (!presented.ok()) return ToGrpcStatus(presented.status());
  return ToGrpcStatus(Grant(*presented, tokens, needed));
}

absl::Status CheckHttpAccess(const std::string* authorization, const ClientTokens& tokens,
                             Access needed) {
  ASSIGN_OR_RETURN(const std::string presented, HttpTokenOf(authorization));
  absl::Status granted = Grant(presented, tokens, needed);
  if (absl::IsUnauthenticated(granted) && absl::StartsWithIgnoreCase(*authorization, "Basic ")) {
    return absl::UnauthenticatedError(
        "wrong token: give the token (or read_token) in the controller's state dir as the "
        "password");
  }
  return granted;
}

}  // namespace rlhfd
