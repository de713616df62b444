#include "tests/support/controller_client.h"

#include <grpcpp/create_channel.h>

#include "common/rpc/auth.h"
#include "common/status/status_macros.h"

namespace rlhfd::testing {

void ControllerClient::Authorize(grpc::ClientContext* context) const {
  AttachToken(context, token);
}

absl::StatusOr<ControllerClient> ConnectToController(const LocalCluster& cluster) {
  ControllerClient client;
  ASSIGN_OR_RETURN(client.token, ResolveClientToken("", cluster.state_dir() + "/token"));
  client.channel = grpc::CreateChannel(cluster.address(), grpc::InsecureChannelCredentials());
  client.jobs = v1::JobService::NewStub(client.channel);
  client.cluster = v1::ClusterService::NewStub(client.channel);
  return client;
}

}  // namespace rlhfd::testing
