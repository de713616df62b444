// The server side of a unary callback-API call that is finished exactly once, whoever finishes
// it (the code that computed its result, or gRPC cancelling it), and CatchAll, which keeps
// exceptions from leaving an RPC handler or a task. Shared by the controller and the workers.
#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/server_callback.h>

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "common/rpc/grpc_status.h"
#include "common/util/text.h"

namespace rlhfd {

// Runs `body` (returning StatusOr<Reply>) and turns anything it throws into INTERNAL, so no
// exception leaves an RPC handler or a loop task.
template <typename Reply, typename Body>
absl::StatusOr<Reply> CatchAll(absl::string_view what, Body&& body) {
  try {
    return body();
  } catch (const std::exception& error) {
    RLOG(ERROR) << what << " threw: " << SanitizeForDisplay(error.what(), 300);
    return absl::InternalError(absl::StrCat(what, " failed inside rlhfd (",
                                            SanitizeForDisplay(error.what(), 200),
                                            "); please report this"));
  } catch (...) {
    RLOG(ERROR) << what << " threw a non-standard exception";
    return absl::InternalError(absl::StrCat(what, " failed inside rlhfd"));
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

  // Runs `hook` if gRPC cancels the call before it is finished (say, to cancel the calls it
  // made in turn). Set it before returning reactor().
  void OnCancel(std::function<void()> hook) const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->on_cancel = std::move(hook);
  }

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
    std::function<void()> on_cancel;
  };
  class Reactor final : public grpc::ServerUnaryReactor {
   public:
    explicit Reactor(std::shared_ptr<State> state) : state_(std::move(state)) {}
    void OnCancel() override {
      std::function<void()> hook;
      {
        std::lock_guard<std::mutex> lock(state_->mutex);
        hook = std::move(state_->on_cancel);
      }
      if (hook) hook();
      Completer(state_).Finish(absl::CancelledError("call cancelled before it was answered"));
    }
    void OnDone() override {
      // The hook may hold what holds a Completer (so this state): let it go with the call.
      std::function<void()> hook;
      {
        std::lock_guard<std::mutex> lock(state_->mutex);
        hook = std::move(state_->on_cancel);
      }
      delete this;
    }

   private:
    std::shared_ptr<State> state_;
  };

  std::shared_ptr<State> state_;
};

}  // namespace rlhfd
