// WorkerService RPC handlers.
#include "worker/service/worker_service.h"

namespace rlhfd::worker {

grpc::ServerUnaryReactor* WorkerServiceImpl::GetWorkerStatus(
    grpc::CallbackServerContext* context, const v1::GetWorkerStatusRequest*,
    v1::GetWorkerStatusReply* reply) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  grpc::Status auth = CheckToken(*context, token_);
  if (auth.ok()) {
    const ControllerLink::State state = link_->state();
    reply->set_worker_id(state.worker_id);
    *reply->mutable_capacity() = link_->capacity();
    reply->set_registered(state.registered);
    reply->set_incarnation(state.incarnation);
    reply->set_start_time_ms(start_time_ms_);
  }
  reactor->Finish(auth);
  return reactor;
}

}  // namespace rlhfd::worker
