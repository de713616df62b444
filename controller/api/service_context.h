// What every controller gRPC adapter needs, and DispatchUnary: the one path of a unary call —
// token check on the RPC thread, then the Controller method on the event loop, then Finish.
#pragma once

#include <string>

#include <grpcpp/server_context.h>
#include <grpcpp/support/server_callback.h>

#include "absl/status/statusor.h"
#include "common/rpc/auth.h"
#include "common/rpc/grpc_status.h"
#include "common/util/event_loop.h"
#include "controller/controller.h"

namespace rlhfd::controller {

struct ServiceContext {
  Controller* controller;
  EventLoop* loop;
  std::string token;
};

// `method` is a Controller member taking `const Request&` and returning StatusOr<Reply>. The
// RPC thread never blocks: the loop finishes the call when it gets to it.
template <typename Request, typename Reply>
grpc::ServerUnaryReactor* DispatchUnary(
    const ServiceContext& service, grpc::CallbackServerContext* context, const Request* request,
    Reply* reply, absl::StatusOr<Reply> (Controller::*method)(const Request&)) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status auth = CheckToken(*context, service.token); !auth.ok()) {
    reactor->Finish(auth);
    return reactor;
  }
  Controller* controller = service.controller;
  service.loop->Post([controller, method, request, reply, reactor] {
    absl::StatusOr<Reply> result = (controller->*method)(*request);
    if (result.ok()) *reply = *std::move(result);
    reactor->Finish(ToGrpcStatus(result.status()));
  });
  return reactor;
}

}  // namespace rlhfd::controller
