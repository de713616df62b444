// gRPC credentials and channel/server arguments from RpcOptions.
#include "common/rpc/grpc_options.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"

namespace rlhfd {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  auto contents = ReadFileToString(path, 1 << 20);
  if (!contents.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": ", contents.status().message()));
  }
  return *contents;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const RpcOptions& options) {
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls_cert and --tls_key");
  }
  if (options.tls_cert_file.empty()) {
    if (options.tls_require_client_cert) {
      return absl::InvalidArgumentError(
          "--tls_require_client_cert needs --tls_cert, --tls_key and --tls_ca");
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions ssl;
  ASSIGN_OR_RETURN(std::string cert, ReadPem(options.tls_cert_file, "tls_cert"));
  ASSIGN_OR_RETURN(std::string key, ReadPem(options.tls_key_file, "tls_key"));
  ssl.pem_key_cert_pairs.push_back({key, cert});
  if (!options.tls_ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem(options.tls_ca_file, "tls_ca"));
  }
  if (options.tls_require_client_cert) {
    if (options.tls_ca_file.empty()) {
      return absl::InvalidArgumentError("--tls_require_client_cert needs --tls_ca");
    }
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

void ApplyServerOptions(const RpcOptions& options, grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(options.max_request_bytes);
  builder->SetMaxSendMessageSize(options.max_reply_bytes);
  grpc::ResourceQuota quota("rlhfd-server");
  quota.Resize(static_cast<size_t>(options.server_memory_bytes));
  builder->SetResourceQuota(quota);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                              options.keepalive_time_ms / 2);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // gRPC sets SO_REUSEPORT by default, which would let a second daemon share our port silently.
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const RpcOptions& options) {
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("a client certificate needs both --tls_cert and --tls_key");
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (options.tls()) {
    grpc::SslCredentialsOptions ssl;
    if (!options.tls_ca_file.empty()) {
      ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem(options.tls_ca_file, "tls_ca"));
    }
    if (!options.tls_cert_file.empty()) {
      ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPem(options.tls_cert_file, "tls_cert"));
      ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPem(options.tls_key_file, "tls_key"));
    }
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(options.max_reply_bytes);
  arguments.SetMaxSendMessageSize(options.max_request_bytes);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Reconnect quickly after a controller restart instead of gRPC's default up-to-120 s backoff.
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  return grpc::CreateCustomChannel(target, credentials, arguments);
}

}  // namespace rlhfd
