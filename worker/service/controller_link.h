// ControllerLink: keeps a worker registered with its controller. It registers (retrying with
// exponential backoff while the controller is away), heartbeats at the interval the controller
// asks for, and registers again whenever the controller does not know it any more (a controller
// restart, or being marked lost).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "rlhfd/v1/worker_service.grpc.pb.h"

namespace rlhfd::worker {

struct ControllerLinkOptions {
  std::string token;
  // Deadline of each RPC to the controller.
  absl::Duration rpc_timeout = absl::Seconds(5);
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // The job attempts the worker hosts, listed in each heartbeat (none if unset).
  std::function<std::vector<v1::JobAttempt>()> hosted;
  // Given each accepted heartbeat's reply and when its request was sent, on the link's thread.
  std::function<void(const v1::HeartbeatReply&, std::chrono::steady_clock::time_point sent)>
      on_heartbeat;
};

class ControllerLink {
 public:
  // Snapshot of the registration, for GetWorkerStatus and the stage API's token check.
  struct State {
    std::string worker_id;
    bool registered = false;
    int64_t incarnation = 0;
    // The token the controller's calls carry, from its last registration reply (kept while
    // registering again: the same controller state dir hands out the same one). Empty until the
    // first registration: no call is accepted before.
    std::string stage_token;
  };

  ControllerLink(std::shared_ptr<v1::WorkerRegistry::StubInterface> registry,
                 ControllerLinkOptions options, v1::WorkerCapacity capacity);
  // Stops the thread.
  ~ControllerLink();
  ControllerLink(const ControllerLink&) = delete;
  ControllerLink& operator=(const ControllerLink&) = delete;

  // Starts registering as `worker_id`, reachable at `advertised_address` (host:port).
  void Start(std::string worker_id, std::string advertised_address);
  void Stop();
  State state() const;
  // The stage token, waiting up to `timeout` while the first registration is under way: the
  // controller may call a worker it has just registered before the reply reaches this side.
  // Empty when none arrived in time.
  std::string WaitForStageToken(absl::Duration timeout) const;
  const v1::WorkerCapacity& capacity() const { return capacity_; }

 private:
  void Run();
  // Registers, retrying until it succeeds or the link stops. Returns the heartbeat interval.
  bool RegisterWithBackoff(absl::Duration* heartbeat_interval);
  // Sleeps for `duration` unless stopped first; false once stopping.
  bool SleepFor(absl::Duration duration);

  std::shared_ptr<v1::WorkerRegistry::StubInterface> registry_;
  ControllerLinkOptions options_;
  v1::WorkerCapacity capacity_;
  const std::string instance_id_;
  std::string advertised_address_;

  mutable std::mutex mutex_;
  mutable std::condition_variable wake_;
  bool stopping_ = false;
  State state_;
  std::thread thread_;
};

}  // namespace rlhfd::worker
