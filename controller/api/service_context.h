// What every controller gRPC adapter needs, and DispatchUnary: the one path of a unary call —
// the token's access checked on the RPC thread, then the Controller method (on the event loop,
// or as the method itself decides), then Finish.
#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/server_callback.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/logging/logging.h"
#include "common/rpc/auth.h"
#include "common/rpc/pending_unary.h"
#include "common/util/event_loop.h"
#include "controller/controller.h"
#include "controller/metrics/call_metrics.h"

namespace rlhfd::controller {

struct ServiceContext {
  Controller* controller;
  EventLoop* loop;
  ClientTokens tokens;
  CallMetrics* call_metrics;  // outlives the services
};

// Counts a call of the RPC that takes `Request` ("grpc/GetJob" for GetJobRequest).
template <typename Request>
void RecordCall(CallMetrics& metrics, const absl::Status& status, absl::Time arrived) {
  std::string name = Request::descriptor()->name();
  if (absl::EndsWith(name, "Request")) name.resize(name.size() - 7);
  metrics.Record("grpc/" + name, absl::StatusCodeToString(status.code()), absl::Now() - arrived);
}

// The one path of a unary call: the caller's token must grant `access` (kRead: reads only,
// kAdmin: changes something), checked on the RPC thread; then `start(finish)` begins the call,
// and `finish` (from any thread, once) records and completes it. No RPC thread waits.
template <typename Request, typename Reply, typename Start>
grpc::ServerUnaryReactor* Dispatch(const ServiceContext& service, Access access,
                                   grpc::CallbackServerContext* context, Reply* reply,
                                   Start start) {
  PendingUnary<Reply> call(reply);
  auto done = call.completer();
  const absl::Time arrived = absl::Now();
  if (grpc::Status auth = CheckAccess(*context, service.tokens, access); !auth.ok()) {
    RecordCall<Request>(*service.call_metrics, FromGrpcStatus(auth), arrived);
    done.Finish(FromGrpcStatus(auth));
    return call.reactor();
  }
  CallMetrics* metrics = service.call_metrics;
  start([metrics, done, arrived](absl::StatusOr<Reply> result) mutable {
    RecordCall<Request>(*metrics, result.status(), arrived);
    done.Finish(std::move(result));
  });
  return call.reactor();
}

// A Controller method that runs on the loop: `const Request&` in, StatusOr<Reply> out. The
// request is copied, because gRPC may free it once the call is cancelled.
template <typename Request, typename Reply>
grpc::ServerUnaryReactor* DispatchUnary(
    const ServiceContext& service, Access access, grpc::CallbackServerContext* context,
    const Request* request, Reply* reply,
    absl::StatusOr<Reply> (Controller::*method)(const Request&)) {
  return Dispatch<Request>(service, access, context, reply, [&](auto finish) {
    service.loop->Post([controller = service.controller, method, copy = *request,
                        finish = std::move(finish)]() mutable {
      finish(CatchAll<Reply>(Request::descriptor()->name(),
                             [&] { return (controller->*method)(copy); }));
    });
  });
}

// A Controller method that runs on the loop, for calls that come often and cost little (a worker's
// heartbeat: 512 a second at 1,024 workers), answered in batches: each call is queued on its RPC
// thread, and the first of a batch posts one task, `window` later, that runs the method for every
// call queued by then. The loop then wakes once per batch instead of once per call, where a
// wake-up (two context switches) costs more than the method.
template <typename Request, typename Reply>
class BatchedUnary {
 public:
  using Method = absl::StatusOr<Reply> (Controller::*)(const Request&);
  BatchedUnary(ServiceContext service, Method method, absl::Duration window)
      : service_(std::move(service)),
        batch_(std::make_shared<Batch>(service_.controller, method)),
        window_(window) {}

  grpc::ServerUnaryReactor* Call(Access access, grpc::CallbackServerContext* context,
                                 const Request* request, Reply* reply) {
    return Dispatch<Request>(service_, access, context, reply, [&](auto finish) {
      bool first = false;
      {
        std::lock_guard<std::mutex> lock(batch_->mutex);
        first = batch_->queued.empty();
        // The request is copied, because gRPC may free it once the call is cancelled.
        batch_->queued.push_back({*request, std::move(finish)});
      }
      // The task holds the batch, not this object, which may go first (an early exit of main).
      if (first) service_.loop->PostAfter(window_, [batch = batch_] { batch->RunQueued(); });
    });
  }

 private:
  struct Queued {
    Request request;
    std::function<void(absl::StatusOr<Reply>)> finish;
  };
  struct Batch {
    Batch(Controller* controller, Method method) : controller(controller), method(method) {}
    void RunQueued() {
      std::vector<Queued> calls;
      {
        std::lock_guard<std::mutex> lock(mutex);
        calls.swap(queued);
      }
      for (Queued& call : calls) {
        call.finish(CatchAll<Reply>(Request::descriptor()->name(),
                                    [&] { return (controller->*method)(call.request); }));
      }
    }
    Controller* const controller;  // outlives the loop
    const Method method;
    std::mutex mutex;
    std::vector<Queued> queued;
  };

  const ServiceContext service_;
  const std::shared_ptr<Batch> batch_;
  const absl::Duration window_;
};

// A Controller method that decides itself what of the call runs on the loop (SubmitJobAsync,
// GetJobMetricsAsync).
template <typename Request, typename Reply>
grpc::ServerUnaryReactor* DispatchUnary(
    const ServiceContext& service, Access access, grpc::CallbackServerContext* context,
    const Request* request, Reply* reply,
    void (Controller::*method)(EventLoop&, const Request&,
                               std::function<void(absl::StatusOr<Reply>)>)) {
  return Dispatch<Request>(service, access, context, reply, [&](auto finish) {
    (service.controller->*method)(*service.loop, *request, std::move(finish));
  });
}

}  // namespace rlhfd::controller
