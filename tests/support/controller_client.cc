#include "tests/support/controller_client.h"

#include <grpcpp/create_channel.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/auth.h"
#include "common/status/status_macros.h"
#include "rlhfd/v1/worker_service.grpc.pb.h"
#include "tests/support/subprocess.h"

namespace rlhfd::testing {

void ControllerClient::Authorize(grpc::ClientContext* context) const {
  AttachToken(context, token);
}

absl::StatusOr<ControllerClient> ConnectToController(const LocalCluster& cluster,
                                                     const std::string& token_file) {
  ControllerClient client;
  ASSIGN_OR_RETURN(client.token, ResolveClientToken("", cluster.state_dir() + "/" + token_file));
  client.channel = grpc::CreateChannel(cluster.address(), grpc::InsecureChannelCredentials());
  client.jobs = v1::JobService::NewStub(client.channel);
  client.cluster = v1::ClusterService::NewStub(client.channel);
  return client;
}

absl::StatusOr<std::string> StageToken(const LocalCluster& cluster) {
  return ResolveClientToken("", cluster.state_dir() + "/" + kStageTokenFile);
}

bool WaitForStageToken(int port, const std::string& stage_token, absl::Duration timeout) {
  auto stub = v1::WorkerService::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  return WaitFor(
      [&] {
        grpc::ClientContext context;
        AttachToken(&context, stage_token);
        context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
        v1::GetWorkerStatusReply reply;
        return stub->GetWorkerStatus(&context, v1::GetWorkerStatusRequest(), &reply).ok();
      },
      timeout);
}

}  // namespace rlhfd::testing
