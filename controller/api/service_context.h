// What every controller gRPC adapter needs, and DispatchUnary: the one path of a unary call —
// token check on the RPC thread, then the Controller method on the event loop, then Finish.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include <grpcpp/server_context.h>
#include <grpcpp/support/server_callback.h>

#include "absl/status/statusor.h"
#include "common/logging/logging.h"
#include "common/rpc/auth.h"
#include "common/util/event_loop.h"
#include "common/rpc/pending_unary.h"
#include "controller/controller.h"

namespace rlhfd::controller {

struct ServiceContext {
  Controller* controller;
  EventLoop* loop;
  std::string token;
};

// `method` is a Controller member taking `const Request&` and returning StatusOr<Reply>. The
// RPC thread never blocks: the loop finishes the call when it gets to it. The request is copied,
// because gRPC may free it once the call is cancelled.
template <typename Request, typename Reply>
grpc::ServerUnaryReactor* DispatchUnary(
    const ServiceContext& service, grpc::CallbackServerContext* context, const Request* request,
    Reply* reply, absl::StatusOr<Reply> (Controller::*method)(const Request&)) {
  PendingUnary<Reply> call(reply);
  auto done = call.completer();
  if (grpc::Status auth = CheckToken(*context, service.token); !auth.ok()) {
    done.Finish(FromGrpcStatus(auth));
    return call.reactor();
  }
  Controller* controller = service.controller;
  service.loop->Post([controller, method, copy = *request, done] {
    done.Finish(CatchAll<Reply>(Request::descriptor()->name(),
                                [&] { return (controller->*method)(copy); }));
  });
  return call.reactor();
}

}  // namespace rlhfd::controller
