// StageService over gRPC: each stage an asynchronous callback-API call with the token and a
// deadline; the reply (or the status) goes to `done` on a gRPC thread.
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <mutex>
#include <set>

#include "common/rpc/auth.h"
#include "common/rpc/grpc_status.h"
#include "common/stages/stage_service.h"
#include "rlhfd/v1/worker_service.grpc.pb.h"

namespace rlhfd::stages {
namespace {

class GrpcStageService final : public StageService {
 public:
  GrpcStageService(std::shared_ptr<grpc::Channel> channel, std::string token)
      : stub_(v1::WorkerService::NewStub(std::move(channel))), token_(std::move(token)) {}

#define RLHFD_GRPC_STAGE(Name, Request, Reply)                                              \
  void Name(const v1::Request& request, absl::Duration deadline, StageDone<v1::Reply> done) \
      override {                                                                            \
    /* gRPC reads the request and writes the reply until the callback runs. */              \
    auto call = std::make_shared<Call<v1::Request, v1::Reply>>();                           \
    call->request = request;                                                                \
    Prepare(call->context, deadline);                                                       \
    Track(&call->context);                                                                  \
    stub_->async()->Name(&call->context, &call->request, &call->reply,                      \
                         [this, call, done = std::move(done)](grpc::Status status) {        \
                           Untrack(&call->context);                                         \
                           if (status.ok()) {                                               \
                             done(std::move(call->reply));                                  \
                           } else {                                                         \
                             done(FromGrpcStatus(status));                                  \
                           }                                                                \
                         });                                                                \
  }
  RLHFD_STAGES(RLHFD_GRPC_STAGE)
  RLHFD_GRPC_STAGE(Relay, RelayRequest, RelayReply)
#undef RLHFD_GRPC_STAGE

  void CancelCalls() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (grpc::ClientContext* context : in_flight_) context->TryCancel();
  }

  // Calls in flight hold `this` in their callbacks: wait for them.
  ~GrpcStageService() override {
    CancelCalls();
    std::unique_lock<std::mutex> lock(mutex_);
    drained_.wait(lock, [&] { return in_flight_.empty(); });
  }

 private:
  void Track(grpc::ClientContext* context) {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.insert(context);
  }
  void Untrack(grpc::ClientContext* context) {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.erase(context);
    if (in_flight_.empty()) drained_.notify_all();
  }

  template <typename Request, typename Reply>
  struct Call {
    grpc::ClientContext context;
    Request request;
    Reply reply;
  };

  void Prepare(grpc::ClientContext& context, absl::Duration deadline) const {
    AttachToken(&context, token_);
    context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  }

  std::unique_ptr<v1::WorkerService::Stub> stub_;
  std::string token_;
  std::mutex mutex_;
  std::condition_variable drained_;
  std::set<grpc::ClientContext*> in_flight_;
};

}  // namespace

std::unique_ptr<StageService> MakeGrpcStageService(std::shared_ptr<grpc::Channel> channel,
                                                   std::string token) {
  // In a process without a gRPC server, callback calls run on a completion queue that gRPC
  // 1.51 tears down when the last channel that used it goes and builds again for the next, and
  // that cycle races its thread (an abort in grpc_cq_internal_unref). A driver drops and makes
  // clients as workers come and go, so the first channel is kept for the life of the process
  // and the queue with it.
  static const std::shared_ptr<grpc::Channel> kept = channel;
  (void)kept;
  return std::make_unique<GrpcStageService>(std::move(channel), std::move(token));
}

}  // namespace rlhfd::stages
