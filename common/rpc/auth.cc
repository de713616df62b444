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

absl::StatusOr<std::string> LoadOrCreateToken(const std::string& state_dir) {
  const std::string path = state_dir + "/token";
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

absl::Status CheckBearer(const std::string* authorization, const std::string& expected) {
  if (authorization == nullptr) {
    return absl::UnauthenticatedError(
        "missing bearer token: pass --token_file=<controller state dir>/token or set "
        "RLHFD_TOKEN (HTTP: an 'Authorization: Bearer <token>' header)");
  }
  const absl::string_view value(*authorization);
  if (value.rfind(kBearerPrefix, 0) != 0 ||
      !ConstantTimeEquals(value.substr(sizeof(kBearerPrefix) - 1), expected)) {
    return absl::UnauthenticatedError(
        "wrong bearer token: use the token in the controller's state dir");
  }
  return absl::OkStatus();
}

absl::Status CheckHttpAuthorization(const std::string* authorization, const std::string& expected) {
  constexpr absl::string_view kBasicPrefix = "Basic ";
  if (authorization == nullptr || !absl::StartsWith(*authorization, kBasicPrefix)) {
    return CheckBearer(authorization, expected);
  }
  std::string credentials;
  if (!absl::Base64Unescape(absl::string_view(*authorization).substr(kBasicPrefix.size()),
                            &credentials)) {
    return absl::UnauthenticatedError("the Basic credentials are not base64");
  }
  const size_t colon = credentials.find(':');
  if (colon == std::string::npos ||
      !ConstantTimeEquals(absl::string_view(credentials).substr(colon + 1), expected)) {
    return absl::UnauthenticatedError(
        "wrong token: give the token in the controller's state dir as the password");
  }
  return absl::OkStatus();
}

grpc::Status CheckToken(const grpc::ServerContextBase& context, const std::string& expected) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return ToGrpcStatus(CheckBearer(nullptr, expected));
  const std::string value(it->second.data(), it->second.size());
  return ToGrpcStatus(CheckBearer(&value, expected));
}

}  // namespace rlhfd
