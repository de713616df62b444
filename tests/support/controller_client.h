// What rlhfctl holds to call a LocalCluster's controller, for tests that call its public API
// directly: the token from the state directory, and the JobService and ClusterService stubs on
// one channel.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "rlhfd/v1/cluster_service.grpc.pb.h"
#include "rlhfd/v1/job_service.grpc.pb.h"
#include "tests/support/cluster_fixture.h"

namespace rlhfd::testing {

struct ControllerClient {
  std::string token;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::JobService::Stub> jobs;
  std::unique_ptr<v1::ClusterService::Stub> cluster;

  // Puts the token on a call.
  void Authorize(grpc::ClientContext* context) const;
};

// A client of the cluster's controller (plaintext); an error if its token cannot be read.
// `token_file`: which of the state directory's tokens it holds.
absl::StatusOr<ControllerClient> ConnectToController(const LocalCluster& cluster,
                                                     const std::string& token_file = "token");

// The token the cluster's controller hands its workers (<state_dir>/stage_token), for tests that
// call a worker's stage API as the controller does.
absl::StatusOr<std::string> StageToken(const LocalCluster& cluster);

// Waits (up to `timeout`) until the worker serving on `port` takes calls with the stage token,
// that is until it has registered; false if it does not.
bool WaitForStageToken(int port, const std::string& stage_token, absl::Duration timeout);

}  // namespace rlhfd::testing
