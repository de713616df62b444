// gRPC server start-up and shutdown.
#include "common/rpc/rpc_server.h"

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"

namespace rlhfd {

absl::StatusOr<std::unique_ptr<RpcServer>> RpcServer::Start(
    const std::string& address, const RpcOptions& options,
    const std::vector<grpc::Service*>& services) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   MakeServerCredentials(options));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, credentials, &port);
  ApplyServerOptions(options, &builder);
  for (grpc::Service* service : services) builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address,
        ": is the address in use (another daemon running?) or not an interface of this host? "
        "Use host:0 to pick a free port"));
  }
  return std::unique_ptr<RpcServer>(new RpcServer(std::move(server), port));
}

RpcServer::~RpcServer() { Shutdown(absl::ZeroDuration()); }

void RpcServer::Shutdown(absl::Duration deadline) {
  if (shut_down_) return;
  shut_down_ = true;
  server_->Shutdown(absl::ToChronoTime(absl::Now() + deadline));
  server_->Wait();
}

bool IsLoopbackAddress(const std::string& address) {
  const std::string host = address.substr(0, address.rfind(':'));
  return host == "localhost" || host == "[::1]" || absl::StartsWith(host, "127.");
}

absl::Status WritePortFile(const std::string& path, int port) {
  return WriteFileAtomically(path, absl::StrCat(port, "\n"));
}

}  // namespace rlhfd
