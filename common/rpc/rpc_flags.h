// Flags shared by every rlhfd program for reaching or serving the control plane: the bearer
// token and TLS files. Each main() calls these once after absl::ParseCommandLine.
#pragma once

#include <string>

#include "common/rpc/grpc_options.h"

namespace rlhfd {

// RpcOptions from --tls_cert, --tls_key, --tls_ca, --tls_require_client_cert.
RpcOptions RpcOptionsFromFlags();

// --token and --token_file, for ResolveClientToken.
std::string TokenFlag();
std::string TokenFileFlag();

}  // namespace rlhfd
