// WorkerServiceImpl: the gRPC service each worker runs for the controller. A thin adapter: the
// stage token (the one the controller handed this worker when it registered; never the users'
// admin or read-only token) is checked on the RPC thread, and each RL stage goes to the role host
// (a StageService), which answers from its executor; no RPC thread waits. Relay calls (fan-out
// through the workers) go to the StageRelay.
#pragma once

#include <functional>
#include <string>

#include "common/rpc/auth.h"
#include "common/stages/stage_service.h"
#include "rlhfd/v1/worker_service.grpc.pb.h"
#include "worker/service/controller_link.h"
#include "worker/service/stage_relay.h"

namespace rlhfd::worker {

// What the worker's status reports of the jobs it hosts (the role host knows).
struct HostedStatus {
  int jobs = 0;
  int64_t memory_in_use_bytes = 0;
};

class WorkerServiceImpl final : public v1::WorkerService::CallbackService {
 public:
  // `relay`: null when this worker relays no calls (Relay answers UNIMPLEMENTED).
  WorkerServiceImpl(const ControllerLink* link, stages::StageService* stages, StageRelay* relay,
                    std::function<HostedStatus()> hosted, std::function<std::string()> stage_token,
                    int64_t start_time_ms)
      : link_(link),
        stages_(stages),
        relay_(relay),
        hosted_(std::move(hosted)),
        stage_token_(std::move(stage_token)),
        start_time_ms_(start_time_ms) {}

  grpc::ServerUnaryReactor* GetWorkerStatus(grpc::CallbackServerContext* context,
                                            const v1::GetWorkerStatusRequest* request,
                                            v1::GetWorkerStatusReply* reply) override;

#define RLHFD_SERVE_STAGE(Name, Request, Reply)                                                    \
  grpc::ServerUnaryReactor* Name(grpc::CallbackServerContext* context, const v1::Request* request, \
                                 v1::Reply* reply) override {                                      \
    return Serve(context, request, reply, &stages::StageService::Name);                            \
  }
  RLHFD_STAGES(RLHFD_SERVE_STAGE)
#undef RLHFD_SERVE_STAGE

  grpc::ServerUnaryReactor* Relay(grpc::CallbackServerContext* context,
                                  const v1::RelayRequest* request, v1::RelayReply* reply) override;

 private:
  template <typename Request, typename Reply>
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* context, const Request* request,
                                  Reply* reply,
                                  void (stages::StageService::*method)(const Request&,
                                                                       absl::Duration,
                                                                       stages::StageDone<Reply>));

  // OK for a call carrying the controller's stage token.
  grpc::Status CheckStageToken(const grpc::ServerContextBase& context) const;

  const ControllerLink* link_;
  stages::StageService* stages_;
  StageRelay* relay_;
  std::function<HostedStatus()> hosted_;
  // The controller's stage token, from the link's registration (empty before the first).
  std::function<std::string()> stage_token_;
  int64_t start_time_ms_;
};

}  // namespace rlhfd::worker
