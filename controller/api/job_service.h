// gRPC adapter of the public JobService onto Controller.
#pragma once

#include <memory>

#include "controller/api/job_watch_reactor.h"
#include "controller/api/service_context.h"
#include "rlhfd/v1/job_service.grpc.pb.h"

namespace rlhfd::controller {

class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  explicit JobServiceImpl(ServiceContext service)
      : service_(std::move(service)), watches_(std::make_shared<JobWatchReactor::Registry>()) {}

  // Ends every WatchJob stream now and refuses new ones: the first step of a shutdown.
  void EndWatches() { watches_->EndAll(); }

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const v1::SubmitJobRequest* request,
                                      v1::SubmitJobReply* reply) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request,
                                   v1::GetJobReply* reply) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsReply* reply) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::CancelJobReply* reply) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* context,
                                      const v1::DeleteJobRequest* request,
                                      v1::DeleteJobReply* reply) override {
    return DispatchUnary(service_, Access::kAdmin, context, request, reply, &Controller::DeleteJob);
  }
  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(grpc::CallbackServerContext* context,
                                                   const v1::WatchJobRequest* request) override;
  grpc::ServerUnaryReactor* GetJobMetrics(grpc::CallbackServerContext* context,
                                          const v1::GetJobMetricsRequest* request,
                                          v1::GetJobMetricsReply* reply) override {
    return DispatchUnary(service_, Access::kRead, context, request, reply,
                         &Controller::GetJobMetricsAsync);
  }
  grpc::ServerUnaryReactor* GetJobSamples(grpc::CallbackServerContext* context,
                                          const v1::GetJobSamplesRequest* request,
                                          v1::GetJobSamplesReply* reply) override {
    return DispatchUnary(service_, Access::kRead, context, request, reply,
                         &Controller::GetJobSamplesAsync);
  }

 private:
  ServiceContext service_;
  std::shared_ptr<JobWatchReactor::Registry> watches_;
};

}  // namespace rlhfd::controller
