// WatchJob streaming; see job_watch_reactor.h.
#include "controller/api/job_watch_reactor.h"

#include "common/jobs/job_states.h"

namespace rlhfd::controller {

namespace {

const grpc::Status& ShuttingDown() {
  static const grpc::Status status(grpc::StatusCode::UNAVAILABLE,
                                   "the controller is shutting down; watch again once it is back");
  return status;
}

}  // namespace

void JobWatchReactor::Registry::EndAll() {
  std::set<std::shared_ptr<Stream>> streams;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ended_ = true;
    streams.swap(streams_);
  }
  for (const std::shared_ptr<Stream>& stream : streams) {
    std::lock_guard<std::recursive_mutex> lock(stream->mutex);
    FinishLocked(*stream, ShuttingDown());
  }
}

JobWatchReactor::JobWatchReactor(ServiceContext service, std::shared_ptr<Registry> registry,
                                 const grpc::CallbackServerContext& context,
                                 const v1::WatchJobRequest& request)
    : service_(std::move(service)),
      registry_(std::move(registry)),
      stream_(std::make_shared<Stream>()) {
  stream_->reactor = this;
  if (grpc::Status auth = CheckAccess(context, service_.tokens, Access::kRead); !auth.ok()) {
    std::lock_guard<std::recursive_mutex> lock(stream_->mutex);
    FinishLocked(*stream_, auth);
    return;
  }
  bool ended;
  {
    std::lock_guard<std::mutex> lock(registry_->mutex_);
    ended = registry_->ended_;
    if (!ended) registry_->streams_.insert(stream_);
  }
  if (ended) {
    std::lock_guard<std::recursive_mutex> lock(stream_->mutex);
    FinishLocked(*stream_, ShuttingDown());
    return;
  }
  std::shared_ptr<Stream> stream = stream_;
  Controller* controller = service_.controller;
  service_.loop->Post([controller, request, stream] {
    auto subscription = controller->WatchJob(
        request, [stream](const v1::JobEvent& event) { Enqueue(stream, event); });
    std::lock_guard<std::recursive_mutex> lock(stream->mutex);
    if (subscription.ok()) {
      stream->subscription = *subscription;
    } else {
      FinishLocked(*stream, ToGrpcStatus(subscription.status()));
    }
  });
}

void JobWatchReactor::Enqueue(const std::shared_ptr<Stream>& stream, const v1::JobEvent& event) {
  std::lock_guard<std::recursive_mutex> lock(stream->mutex);
  if (stream->reactor == nullptr || stream->finished) return;
  stream->pending.Push(event);
  if (IsTerminal(event.state())) stream->end_after_pending = true;
  if (!stream->writing) {
    stream->writing = stream->pending.Pop();
    stream->reactor->StartWrite(&*stream->writing);
  }
}

void JobWatchReactor::OnWriteDone(bool ok) {
  std::shared_ptr<Stream> stream = stream_;  // `this` may be deleted inside Finish.
  std::lock_guard<std::recursive_mutex> lock(stream->mutex);
  stream->writing.reset();
  if (!ok) {
    FinishLocked(*stream, grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream broken"));
  } else if (!stream->pending.empty() && !stream->finished) {
    stream->writing = stream->pending.Pop();
    StartWrite(&*stream->writing);
  } else if (stream->end_after_pending) {
    FinishLocked(*stream, grpc::Status::OK);
  }
}

void JobWatchReactor::OnCancel() {
  std::shared_ptr<Stream> stream = stream_;
  std::lock_guard<std::recursive_mutex> lock(stream->mutex);
  FinishLocked(*stream, grpc::Status::CANCELLED);
}

void JobWatchReactor::FinishLocked(Stream& stream, const grpc::Status& status) {
  if (stream.finished || stream.reactor == nullptr) return;
  stream.finished = true;
  stream.reactor->Finish(status);
}

void JobWatchReactor::OnDone() {
  std::shared_ptr<Stream> stream = stream_;
  {
    std::lock_guard<std::mutex> lock(registry_->mutex_);
    registry_->streams_.erase(stream);
  }
  {
    std::lock_guard<std::recursive_mutex> lock(stream->mutex);
    stream->reactor = nullptr;
  }
  Controller* controller = service_.controller;
  // Subscription ids are set on the loop before this task runs there (posted earlier).
  service_.loop->Post([controller, stream] {
    if (stream->subscription != 0) controller->UnwatchJob(stream->subscription);
  });
  delete this;
}

}  // namespace rlhfd::controller
