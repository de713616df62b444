// What every controller gRPC adapter needs, and DispatchUnary: the one path of a unary call —
// token check on the RPC thread, then the Controller method on the event loop, then Finish.
#pragma once

#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <grpcpp/server_context.h>
#include <grpcpp/support/server_callback.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "common/rpc/auth.h"
#include "common/rpc/grpc_status.h"
#include "common/util/event_loop.h"
#include "common/util/text.h"
#include "controller/controller.h"

namespace rlhfd::controller {

struct ServiceContext {
  Controller* controller;
  EventLoop* loop;
  std::string token;
};

// Runs `body` (returning StatusOr<Reply>) and turns anything it throws into INTERNAL, so no
// exception leaves an RPC handler or a loop task.
template <typename Reply, typename Body>
absl::StatusOr<Reply> CatchAll(absl::string_view what, Body&& body) {
  try {
    return body();
  } catch (const std::exception& error) {
    RLOG(ERROR) << what << " threw: " << SanitizeForDisplay(error.what(), 300);
    return absl::InternalError(absl::StrCat(what, " failed inside the controller (",
                                            SanitizeForDisplay(error.what(), 200),
                                            "); please report this"));
  } catch (...) {
    RLOG(ERROR) << what << " threw a non-standard exception";
    return absl::InternalError(absl::StrCat(what, " failed inside the controller"));
  }
}

// A unary call that is finished once: by whoever computes its result, or by gRPC cancelling it
// (client gone, deadline, server shutdown), whichever comes first. So a shutdown never waits for
// a loop that is busy, and a result that arrives after the call is gone is dropped safely.
template <typename Reply>
class PendingUnary {
  struct State;
  class Reactor;

 public:
  // Starts the call; `reactor()` is what the handler returns to gRPC.
  explicit PendingUnary(Reply* reply) : state_(std::make_shared<State>()) {
    state_->reply = reply;
    state_->reactor = new Reactor(state_);  // Deletes itself in OnDone.
  }

  grpc::ServerUnaryReactor* reactor() const { return state_->reactor; }

  // A handle the loop may hold past the call's end.
  class Completer {
   public:
    void Finish(absl::StatusOr<Reply> result) const {
      std::unique_lock<std::mutex> lock(state_->mutex);
      if (state_->finished) return;
      state_->finished = true;
      if (result.ok()) *state_->reply = *std::move(result);
      Reactor* reactor = state_->reactor;
      lock.unlock();
      // Valid until OnDone, which cannot run before this Finish.
      reactor->Finish(ToGrpcStatus(result.status()));
    }

    // Only PendingUnary can name State, so only it makes these.
    explicit Completer(std::shared_ptr<State> state) : state_(std::move(state)) {}

   private:
    std::shared_ptr<State> state_;
  };
  Completer completer() const { return Completer(state_); }

 private:
  struct State {
    std::mutex mutex;
    bool finished = false;
    Reply* reply = nullptr;
    Reactor* reactor = nullptr;
  };
  class Reactor final : public grpc::ServerUnaryReactor {
   public:
    explicit Reactor(std::shared_ptr<State> state) : state_(std::move(state)) {}
    void OnCancel() override {
      Completer(state_).Finish(absl::CancelledError("call cancelled before it was answered"));
    }
    void OnDone() override { delete this; }

   private:
    std::shared_ptr<State> state_;
  };

  std::shared_ptr<State> state_;
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
