// WorkerService RPC handlers.
#include "worker/service/worker_service.h"

#include <chrono>

#include "common/rpc/grpc_status.h"
#include "common/rpc/pending_unary.h"

namespace rlhfd::worker {

grpc::Status WorkerServiceImpl::CheckStageToken(const grpc::ServerContextBase& context) const {
  const std::string stage_token = stage_token_();
  if (stage_token.empty()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "this worker has not registered with a controller yet: no stage token");
  }
  return CheckToken(context, stage_token, "the worker's stage token");
}

grpc::ServerUnaryReactor* WorkerServiceImpl::GetWorkerStatus(grpc::CallbackServerContext* context,
                                                             const v1::GetWorkerStatusRequest*,
                                                             v1::GetWorkerStatusReply* reply) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  grpc::Status status = CheckStageToken(*context);
  if (status.ok()) {
    // What the role host reports can throw (a CUDA context in an error state, asked for its
    // memory): answered as INTERNAL with the reason, not left to gRPC, which would answer
    // UNIMPLEMENTED and never finish the reactor taken above.
    absl::StatusOr<v1::GetWorkerStatusReply> filled =
        CatchAll<v1::GetWorkerStatusReply>("GetWorkerStatus", [&] {
          v1::GetWorkerStatusReply out;
          const ControllerLink::State state = link_->state();
          out.set_worker_id(state.worker_id);
          *out.mutable_capacity() = link_->capacity();
          out.set_registered(state.registered);
          out.set_incarnation(state.incarnation);
          out.set_start_time_ms(start_time_ms_);
          const HostedStatus hosted = hosted_();
          out.set_jobs_hosted(hosted.jobs);
          out.set_memory_in_use_bytes(hosted.memory_in_use_bytes);
          return out;
        });
    if (filled.ok()) {
      *reply = *std::move(filled);
    } else {
      status = ToGrpcStatus(filled.status());
    }
  }
  reactor->Finish(status);
  return reactor;
}

template <typename Request, typename Reply>
grpc::ServerUnaryReactor* WorkerServiceImpl::Serve(
    grpc::CallbackServerContext* context, const Request* request, Reply* reply,
    void (stages::StageService::*method)(const Request&, absl::Duration,
                                         stages::StageDone<Reply>)) {
  PendingUnary<Reply> call(reply);
  auto done = call.completer();
  if (grpc::Status auth = CheckStageToken(*context); !auth.ok()) {
    done.Finish(FromGrpcStatus(auth));
    return call.reactor();
  }
  const absl::Duration deadline =
      absl::FromChrono(context->deadline() - std::chrono::system_clock::now());
  // The role host copies the request before this returns; the reply comes from its executor.
  (stages_->*method)(*request, deadline,
                     [done](absl::StatusOr<Reply> result) { done.Finish(std::move(result)); });
  return call.reactor();
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Relay(grpc::CallbackServerContext* context,
                                                   const v1::RelayRequest* request,
                                                   v1::RelayReply* reply) {
  PendingUnary<v1::RelayReply> call(reply);
  auto done = call.completer();
  grpc::Status auth = CheckStageToken(*context);
  if (!auth.ok()) {
    done.Finish(FromGrpcStatus(auth));
    return call.reactor();
  }
  if (relay_ == nullptr) {
    done.Finish(absl::UnimplementedError("this worker relays no stage calls"));
    return call.reactor();
  }
  const absl::Duration deadline =
      absl::FromChrono(context->deadline() - std::chrono::system_clock::now());
  absl::StatusOr<std::shared_ptr<RelayedCalls>> calls = relay_->Start(
      *request, deadline, stage_token_(), [done](v1::RelayReply result) { done.Finish(result); });
  if (!calls.ok()) {
    done.Finish(calls.status());
    return call.reactor();
  }
  // The controller gave up on the relay (its job cancelled, a stage failed elsewhere): so do the
  // calls made for it.
  call.OnCancel([weak = std::weak_ptr<RelayedCalls>(*calls)] {
    if (const std::shared_ptr<RelayedCalls> calls = weak.lock()) calls->Cancel();
  });
  return call.reactor();
}

}  // namespace rlhfd::worker
