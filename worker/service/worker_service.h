// WorkerServiceImpl: the gRPC service each worker runs for the controller. For now it reports
// the worker's own view of itself; the RL stage RPCs join as the engines land.
#pragma once

#include <string>

#include "common/rpc/auth.h"
#include "rlhfd/v1/worker_service.grpc.pb.h"
#include "worker/service/controller_link.h"

namespace rlhfd::worker {

class WorkerServiceImpl final : public v1::WorkerService::CallbackService {
 public:
  WorkerServiceImpl(const ControllerLink* link, std::string token, int64_t start_time_ms)
      : link_(link),
        token_(std::move(token)),
        start_time_ms_(start_time_ms) {}

  grpc::ServerUnaryReactor* GetWorkerStatus(grpc::CallbackServerContext* context,
                                            const v1::GetWorkerStatusRequest* request,
                                            v1::GetWorkerStatusReply* reply) override;

 private:
  const ControllerLink* link_;
  std::string token_;
  int64_t start_time_ms_;
};

}  // namespace rlhfd::worker
