// JobService adapter: unary calls through DispatchUnary, WatchJob through JobWatchReactor.
#include "controller/api/job_service.h"

#include "controller/api/job_watch_reactor.h"

namespace rlhfd::controller {

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* context,
                                                    const v1::SubmitJobRequest* request,
                                                    v1::SubmitJobReply* reply) {
  return DispatchUnary(service_, Access::kAdmin, context, request, reply,
                       &Controller::SubmitJobAsync);
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
