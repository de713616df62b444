// One options struct for every gRPC endpoint of rlhfd: TLS/mTLS, keepalive and message caps, so
// servers and clients of all three programs are configured the same way.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include "absl/status/statusor.h"

namespace rlhfd {

struct RpcOptions {
  // PEM files. With cert and key the server speaks TLS; a client with ca_file verifies the server
  // against it (and presents cert/key when given: mTLS).
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_ca_file;
  // Server only: demand and verify client certificates against tls_ca_file.
  bool tls_require_client_cert = false;
  // Largest request a server reads (and a client sends). Messages are read before their token
  // is checked, so this bounds what an unauthenticated peer can make a server hold; a
  // control-plane request is at most a 1 MiB config.
  int max_request_bytes = 4 << 20;
  // Largest reply a server sends (and a client reads): job and worker lists.
  int max_reply_bytes = 64 << 20;
  // Memory a server's gRPC core may use for all its connections and calls together.
  int64_t server_memory_bytes = int64_t{256} << 20;
  // Keepalive pings on idle connections, so a dead peer is noticed.
  int keepalive_time_ms = 30'000;
  int keepalive_timeout_ms = 10'000;

  bool tls() const { return !tls_cert_file.empty() || !tls_ca_file.empty(); }
};

// Credentials of a server; errors name the unreadable file or the missing half of a pair.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const RpcOptions& options);

// Message caps and keepalive for a server.
void ApplyServerOptions(const RpcOptions& options, grpc::ServerBuilder* builder);

// A channel to `target` (host:port) with the options' credentials, keepalive and caps.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const RpcOptions& options);

}  // namespace rlhfd
