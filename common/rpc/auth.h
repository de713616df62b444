// Bearer-token authentication of every control-plane RPC ("authorization: Bearer <token>").
// The controller creates the cluster token in its state directory on first start; clients and
// workers take it from a flag, $RLHFD_TOKEN, or a token file.
#pragma once

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/statusor.h"

namespace rlhfd {

// 32 random bytes from the kernel, hex-encoded.
absl::StatusOr<std::string> GenerateToken();

// Reads <state_dir>/token, creating it (mode 0600) with a fresh token if it does not exist.
absl::StatusOr<std::string> LoadOrCreateToken(const std::string& state_dir);

// The client's token: `token` if set, else $RLHFD_TOKEN, else the contents of `token_file` (or
// $RLHFD_TOKEN_FILE). Errors say where a token can be given.
absl::StatusOr<std::string> ResolveClientToken(const std::string& token,
                                               const std::string& token_file);

// Adds the bearer token to an outgoing call.
void AttachToken(grpc::ClientContext* context, const std::string& token);

// OK when the call carries `expected`; UNAUTHENTICATED otherwise. Compares in constant time.
grpc::Status CheckToken(const grpc::ServerContextBase& context, const std::string& expected);
// The same check of an authorization header's value (nullptr: the request has none).
absl::Status CheckBearer(const std::string* authorization, const std::string& expected);
// The REST gateway's check: "Bearer <token>", or HTTP Basic with the token as the password (any
// user name), which is how a browser asks for it once and keeps it for the session.
absl::Status CheckHttpAuthorization(const std::string* authorization, const std::string& expected);

}  // namespace rlhfd
