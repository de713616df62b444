// JobService adapter: unary calls through DispatchUnary, WatchJob through JobWatchReactor.
#include "controller/api/job_service.h"

#include "controller/api/job_watch_reactor.h"

namespace rlhfd::controller {

// The config is parsed and validated here on the RPC thread (bounded work that needs no
// controller state), so a large config never holds up the loop; only storing it runs there.
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
  auto prepared = CatchAll<JobManager::Submission>(
      "SubmitJob", [&] { return JobManager::Prepare(*request); });
  if (!prepared.ok()) {
    RecordCall<v1::SubmitJobRequest>(*service_.call_metrics, prepared.status(), arrived);
    done.Finish(prepared.status());
    return call.reactor();
  }
  Controller* controller = service_.controller;
  CallMetrics* metrics = service_.call_metrics;
  service_.loop->Post([controller, metrics, submission = *std::move(prepared), done,
                       arrived]() mutable {
    absl::StatusOr<v1::SubmitJobReply> result = CatchAll<v1::SubmitJobReply>(
        "SubmitJob", [&] { return controller->SubmitPrepared(std::move(submission)); });
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
