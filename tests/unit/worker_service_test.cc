// The worker's GetWorkerStatus over a real gRPC server on loopback: what it reports, and a role
// host whose report throws (a CUDA context in an error state, asked for its memory) answered as
// INTERNAL with the reason — not UNIMPLEMENTED, which is what gRPC answers for a handler that
// throws, leaving the reactor the handler took unfinished.
#include "worker/service/worker_service.h"

#include <grpcpp/grpcpp.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/auth.h"
#include "common/rpc/grpc_options.h"
#include "rlhfd/v1/worker_service.grpc.pb.h"
#include "worker/service/controller_link.h"

namespace rlhfd {
namespace {

constexpr char kToken[] = "status-test-token";

// One worker service with `hosted` as its role host's report; the link is never started (not
// registered, no worker id).
class StatusServer {
 public:
  explicit StatusServer(std::function<worker::HostedStatus()> hosted)
      : link_(nullptr, worker::ControllerLinkOptions{}, v1::WorkerCapacity{}),
        service_(
            &link_, nullptr, nullptr, std::move(hosted), [] { return std::string(kToken); }, 1234) {
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    REQUIRE(server_ != nullptr);
    auto channel = MakeChannel(absl::StrCat("127.0.0.1:", port), RpcOptions{});
    REQUIRE(channel.ok());
    stub_ = v1::WorkerService::NewStub(*channel);
  }
  ~StatusServer() { server_->Shutdown(std::chrono::system_clock::now()); }

  std::pair<grpc::Status, v1::GetWorkerStatusReply> Get(const std::string& token) {
    grpc::ClientContext context;
    AttachToken(&context, token);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::GetWorkerStatusReply reply;
    const grpc::Status status = stub_->GetWorkerStatus(&context, {}, &reply);
    return {status, reply};
  }

 private:
  worker::ControllerLink link_;
  worker::WorkerServiceImpl service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
};

TEST_CASE("GetWorkerStatus reports the role host's jobs and memory", "[worker_service]") {
  StatusServer server([] { return worker::HostedStatus{.jobs = 2, .memory_in_use_bytes = 4096}; });
  const auto [status, reply] = server.Get(kToken);
  REQUIRE(status.ok());
  CHECK(reply.jobs_hosted() == 2);
  CHECK(reply.memory_in_use_bytes() == 4096);
  CHECK(reply.start_time_ms() == 1234);
  CHECK_FALSE(reply.registered());
  CHECK(server.Get("not-the-token").first.error_code() == grpc::StatusCode::UNAUTHENTICATED);
}

TEST_CASE("GetWorkerStatus answers a report that throws as INTERNAL with the reason",
          "[worker_service]") {
  StatusServer server([]() -> worker::HostedStatus {
    throw std::runtime_error("CUDA error: an illegal memory access was encountered");
  });
  for (int call = 0; call < 2; ++call) {  // And the service still answers after it.
    const auto [status, reply] = server.Get(kToken);
    CHECK(status.error_code() == grpc::StatusCode::INTERNAL);
    CHECK(absl::StrContains(status.error_message(), "GetWorkerStatus"));
    CHECK(absl::StrContains(status.error_message(), "an illegal memory access"));
    CHECK(reply.worker_id().empty());
  }
}

}  // namespace
}  // namespace rlhfd
