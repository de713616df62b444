// Definitions of the shared control-plane flags.
#include "common/rpc/rpc_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, token, "",
          "Bearer token for control-plane RPCs (prefer --token_file or $RLHFD_TOKEN_FILE: flags "
          "show in `ps`; $RLHFD_TOKEN also works)");
ABSL_FLAG(std::string, token_file, "",
          "File holding the bearer token, e.g. <controller state dir>/token; default "
          "$RLHFD_TOKEN_FILE");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate: the server's, or the client's for mTLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key matching --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle: clients verify the server with it; servers verify client certs");
ABSL_FLAG(bool, tls_require_client_cert, false, "Server: require client certificates (mTLS)");

namespace rlhfd {

RpcOptions RpcOptionsFromFlags() {
  RpcOptions options;
  options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  options.tls_require_client_cert = absl::GetFlag(FLAGS_tls_require_client_cert);
  return options;
}

std::string TokenFlag() { return absl::GetFlag(FLAGS_token); }
std::string TokenFileFlag() { return absl::GetFlag(FLAGS_token_file); }

}  // namespace rlhfd
