// JobWatchReactor: the server side of JobService.WatchJob. It subscribes to the job's events on
// the event loop and writes them one at a time until the job ends or the client goes away.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <set>

#include <grpcpp/support/server_callback.h>

#include "controller/api/service_context.h"
#include "controller/api/watch_event_queue.h"
#include "rlhfd/v1/job_service.pb.h"

namespace rlhfd::controller {

class JobWatchReactor final : public grpc::ServerWriteReactor<v1::JobEvent> {
  struct Stream;

 public:
  // The open watch streams, so a shutdown can end them at once instead of waiting out its
  // deadline for streams that would never end by themselves.
  class Registry {
   public:
    // Ends every open stream with UNAVAILABLE, and every later one as it starts.
    void EndAll();

   private:
    friend class JobWatchReactor;
    std::mutex mutex_;
    bool ended_ = false;
    std::set<std::shared_ptr<Stream>> streams_;
  };

  JobWatchReactor(ServiceContext service, std::shared_ptr<Registry> registry,
                  const grpc::CallbackServerContext& context, const v1::WatchJobRequest& request);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // State shared with the event-loop subscription, which may outlive the reactor. The mutex is
  // recursive because gRPC may run a reaction inline from StartWrite or Finish.
  struct Stream {
    std::recursive_mutex mutex;
    JobWatchReactor* reactor = nullptr;  // Null once the call is done.
    std::optional<v1::JobEvent> writing;  // Handed to StartWrite, until OnWriteDone.
    WatchEventQueue pending;
    bool end_after_pending = false;  // The job ended: finish once its last event is written.
    bool finished = false;
    int64_t subscription = 0;
  };

  // Runs on the event loop for each event of the job.
  static void Enqueue(const std::shared_ptr<Stream>& stream, const v1::JobEvent& event);
  // Finishes the call once; the caller holds the stream's mutex.
  static void FinishLocked(Stream& stream, const grpc::Status& status);

  ServiceContext service_;
  std::shared_ptr<Registry> registry_;
  std::shared_ptr<Stream> stream_;
};

}  // namespace rlhfd::controller
