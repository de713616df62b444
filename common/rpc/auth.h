// Bearer-token authentication of every control-plane RPC ("authorization: Bearer <token>").
// The controller creates three tokens in its state directory on first start, each for one kind of
// caller (docs/operations.md, "Credentials"):
//   token        admin: submits and cancels jobs, drains workers; workers register with it
//   read_token   read-only: Prometheus scrapers, dashboards, monitoring scripts
//   stage_token  cluster-internal: the only token workers' stage API accepts; the controller hands
//                it to each worker when it registers, so no user or scraper ever holds it
// Clients and workers take theirs from a flag, $RLHFD_TOKEN, or a token file.
#pragma once

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/statusor.h"

namespace rlhfd {

// 32 random bytes from the kernel, hex-encoded.
absl::StatusOr<std::string> GenerateToken();

inline constexpr char kAdminTokenFile[] = "token";
inline constexpr char kReadTokenFile[] = "read_token";
inline constexpr char kStageTokenFile[] = "stage_token";

// Reads <state_dir>/<file>, creating it (mode 0600) with a fresh token if it does not exist.
absl::StatusOr<std::string> LoadOrCreateToken(const std::string& state_dir,
                                              const std::string& file = kAdminTokenFile);

// What a call needs of its caller's token.
enum class Access { kRead, kAdmin };

// The tokens the controller accepts from clients: the admin token grants everything, the
// read-only one (empty: none) only kRead.
struct ClientTokens {
  std::string admin;
  std::string read_only;
};

// The client's token: `token` if set, else $RLHFD_TOKEN, else the contents of `token_file` (or
// $RLHFD_TOKEN_FILE). Errors say where a token can be given.
absl::StatusOr<std::string> ResolveClientToken(const std::string& token,
                                               const std::string& token_file);

// Adds the bearer token to an outgoing call.
void AttachToken(grpc::ClientContext* context, const std::string& token);

// OK when the call carries `expected`; UNAUTHENTICATED otherwise (`what` names the token in the
// message). Compares in constant time.
grpc::Status CheckToken(const grpc::ServerContextBase& context, const std::string& expected,
                        const std::string& what);

// OK when the call's token grants `needed`; UNAUTHENTICATED for a missing or unknown token,
// PERMISSION_DENIED for the read-only token where only the admin token will do.
grpc::Status CheckAccess(const grpc::ServerContextBase& context, const ClientTokens& tokens,
                         Access needed);
// The REST gateway's check of an Authorization header's value (nullptr: the request has none):
// "Bearer <token>", or HTTP Basic with the token as the password (any user name), which is how a
// browser asks for it once and keeps it for the session.
absl::Status CheckHttpAccess(const std::string* authorization, const ClientTokens& tokens,
                             Access needed);

}  // namespace rlhfd
