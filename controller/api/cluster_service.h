// gRPC adapters of ClusterService (public) and WorkerRegistry (internal) onto Controller.
#pragma once

#include "controller/api/service_context.h"
#include "rlhfd/v1/cluster_service.grpc.pb.h"
#include "rlhfd/v1/worker_service.grpc.pb.h"

namespace rlhfd::controller {

class ClusterServiceImpl final : public v1::ClusterService::CallbackService {
 public:
  explicit ClusterServiceImpl(ServiceContext service) : service_(std::move(service)) {}

  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersReply* reply) override {
    return DispatchUnary(service_, Access::kRead, context, request, reply,
                         &Controller::ListWorkers);
  }
  grpc::ServerUnaryReactor* GetCluster(grpc::CallbackServerContext* context,
                                       const v1::GetClusterRequest* request,
                                       v1::GetClusterReply* reply) override {
    return DispatchUnary(service_, Access::kRead, context, request, reply, &Controller::GetCluster);
  }
  grpc::ServerUnaryReactor* DrainWorker(grpc::CallbackServerContext* context,
                                        const v1::DrainWorkerRequest* request,
                                        v1::DrainWorkerReply* reply) override {
    return DispatchUnary(service_, Access::kAdmin, context, request, reply,
                         &Controller::DrainWorker);
  }
  grpc::ServerUnaryReactor* UndrainWorker(grpc::CallbackServerContext* context,
                                          const v1::UndrainWorkerRequest* request,
                                          v1::UndrainWorkerReply* reply) override {
    return DispatchUnary(service_, Access::kAdmin, context, request, reply,
                         &Controller::UndrainWorker);
  }

 private:
  ServiceContext service_;
};

class WorkerRegistryImpl final : public v1::WorkerRegistry::CallbackService {
 public:
  explicit WorkerRegistryImpl(ServiceContext service)
      : service_(service), heartbeats_(service, &Controller::Heartbeat, kHeartbeatBatchWindow) {}

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerReply* reply) override {
    return DispatchUnary(service_, Access::kAdmin, context, request, reply,
                         &Controller::RegisterWorker);
  }
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatReply* reply) override {
    return heartbeats_.Call(Access::kAdmin, context, request, reply);
  }

 private:
  // How long a heartbeat may wait for others to be answered with it: small against the
  // heartbeat interval (2 s) and the liveness window (10 s) it is judged by.
  static constexpr absl::Duration kHeartbeatBatchWindow = absl::Milliseconds(20);

  ServiceContext service_;
  BatchedUnary<v1::HeartbeatRequest, v1::HeartbeatReply> heartbeats_;
};

}  // namespace rlhfd::controller
