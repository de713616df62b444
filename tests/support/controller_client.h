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
absl::StatusOr<ControllerClient> ConnectToController(const LocalCluster& cluster);

}  // namespace rlhfd::testing
