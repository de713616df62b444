// StageRelay: the worker's half of fan-out through the workers (worker_service.proto's Relay).
// It makes a group of ranks' stage calls for the controller, forwarding each serialized request
// as it came (a generic gRPC call: it never parses a stage), with this worker's stage token, and
// gathers the replies in the group's order. Channels to the ranks it has called are kept.
#pragma once

#include <grpcpp/generic/generic_stub.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/grpc_options.h"
#include "rlhfd/v1/worker_service.pb.h"

namespace rlhfd::worker {

// The calls of one relay in flight; Cancel ends them (their replies: CANCELLED).
class RelayedCalls {
 public:
  virtual ~RelayedCalls() = default;
  virtual void Cancel() = 0;
};

class StageRelay {
 public:
  // `options`: how this worker reaches others (the TLS files it reaches the controller with).
  explicit StageRelay(RpcOptions options) : options_(std::move(options)) {}

  // Makes `request`'s calls at once, each carrying `token` and ending RelayCallMargin(deadline)
  // before `deadline`; `done` runs once, on a gRPC thread, when every call has answered or one
  // failed with something other than its deadline (the others are then reported unanswered).
  // INVALID_ARGUMENT, at once (and `done` never runs): no calls, a stage the WorkerService does
  // not have, or an address no channel can be made to.
  absl::StatusOr<std::shared_ptr<RelayedCalls>> Start(const v1::RelayRequest& request,
                                                      absl::Duration deadline,
                                                      const std::string& token,
                                                      std::function<void(v1::RelayReply)> done);

  // Relays whose state (contexts, buffers) is still held: in flight, or answered moments ago.
  int64_t relays_held() const { return *relays_held_; }

 private:
  absl::StatusOr<std::shared_ptr<grpc::GenericStub>> StubFor(const std::string& address);

  RpcOptions options_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<grpc::GenericStub>> stubs_;  // by address
  std::atomic<bool> logged_{false};                                  // the first relay is logged
  // Shared with each relay's state, which may outlive this object by its last callback.
  std::shared_ptr<std::atomic<int64_t>> relays_held_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace rlhfd::worker
