// RpcServer: a started gRPC server with its bound port, the standard health service, and a
// bounded shutdown. Shared by the controller and the workers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/grpc_options.h"

namespace rlhfd {

class RpcServer {
 public:
  // Binds `address` (host:port; port 0 picks a free one) and starts serving `services`, which
  // must outlive the server. A bind failure says which address and what to check.
  static absl::StatusOr<std::unique_ptr<RpcServer>> Start(
      const std::string& address, const RpcOptions& options,
      const std::vector<grpc::Service*>& services);

  ~RpcServer();

  // The port actually bound.
  int port() const { return port_; }

  // Stops accepting calls, lets calls in flight finish until `deadline` from now, cancels the
  // rest, and waits for the server to stop. Idempotent.
  void Shutdown(absl::Duration deadline);

 private:
  RpcServer(std::unique_ptr<grpc::Server> server, int port)
      : server_(std::move(server)), port_(port) {}

  std::unique_ptr<grpc::Server> server_;
  int port_;
  bool shut_down_ = false;
};

// Whether `address` (host:port) binds loopback only: 127.x.x.x, [::1] or localhost.
bool IsLoopbackAddress(const std::string& address);

// Writes `port` to `path` atomically, so a supervisor or test can find a server started on
// port 0.
absl::Status WritePortFile(const std::string& path, int port);

}  // namespace rlhfd
