// JobService adapter: unary calls through DispatchUnary, WatchJob through JobWatchReactor.
#include "controller/api/job_service.h"

#include "controller/api/job_watch_reactor.h"

namespace rlhfd::controller {

// The Controller decides what of it runs on the loop (SubmitJobAsync).
grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* context,
                                                    const v1::SubmitJobRequest* request,
                                                    v1::SubmitJobReply* reply) {
  PendingUnary<v1::SubmitJobReply> call(reply);
  auto done = call.completer();
  const absl::Time arrived = absl::Now();
  if (grpc::Status auth = CheckAccess(*context, service_.tokens, Access::kAdmin); !auth.ok()) {
    RecordCall<v1::SubmitJobRequest>(*service_.call_metrics, FromGrpcStatus(auth), arrived);
    done.Finish(FromGrpcStatus(auth));
    return call.reactor();
  }
  CallMetrics* metrics = service_.call_metrics;
  service_.controller->SubmitJobAsync(
      *service_.loop, *request,
      [metrics, done, arrived](absl::StatusOr<v1::SubmitJobReply> result) mutable {
        RecordCall<v1::SubmitJobRequest>(*metrics, result.status(), arrived);
        done.Finish(std::move(result));
      });
  return call.reactor();
}

grpc::ServerUnaryReactor* JobServiceImpl::GetJob(grpc::CallbackServerContext* context,
                                                 const v1::GetJobRequest* request,
                                                 v1::GetJobReply* reply) {
  return DispatchUnary(service_, Access::kRead, context, request, reply, &Controller::GetJob);
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* context,
                                                   const v1::ListJobsRequest* request,
                                                   v1::ListJobsReply* reply) {
  return DispatchUnary(service_, Access::kRead, context, request, reply, &Controller::ListJobs);
}

grpc::ServerUnaryReactor* JobServiceImpl::CancelJob(grpc::CallbackServerContext* context,
                                                    const v1::CancelJobRequest* request,
                                                    v1::CancelJobReply* reply) {
  return DispatchUnary(service_, Access::kAdmin, context, request, reply, &Controller::CancelJob);
}

grpc::ServerWriteReactor<v1::JobEvent>* JobServiceImpl::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  return new JobWatchReactor(service_, watches_, *context, *request);  // Deletes itself in OnDone.
}

}  // namespace rlhfd::controller
