// Registration and heartbeat loop of a worker.
#include "worker/service/controller_link.h"

#include <grpcpp/client_context.h>

#include <algorithm>
#include <random>

#include "absl/strings/str_format.h"

#include "common/logging/logging.h"
#include "common/rpc/auth.h"
#include "worker/device/device_probe.h"

namespace rlhfd::worker {

namespace {

// Tells this process apart from another that registers under the same worker id.
std::string NewInstanceId() {
  std::random_device random;
  return absl::StrFormat("%08x%08x%08x", random(), random(), random());
}

}  // namespace

ControllerLink::ControllerLink(std::shared_ptr<v1::WorkerRegistry::StubInterface> registry,
                               ControllerLinkOptions options, v1::WorkerCapacity capacity)
    : registry_(std::move(registry)),
      options_(std::move(options)),
      capacity_(std::move(capacity)),
      instance_id_(NewInstanceId()) {}

ControllerLink::~ControllerLink() { Stop(); }

void ControllerLink::Start(std::string worker_id, std::string advertised_address) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    state_.worker_id = std::move(worker_id);
  }
  advertised_address_ = std::move(advertised_address);
  thread_ = std::thread([this] { Run(); });
}

void ControllerLink::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

ControllerLink::State ControllerLink::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_;
}

bool ControllerLink::SleepFor(absl::Duration duration) {
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait_for(lock, absl::ToChronoNanoseconds(duration), [this] { return stopping_; });
  return !stopping_;
}

std::string ControllerLink::WaitForStageToken(absl::Duration timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                 [this] { return stopping_ || !state_.stage_token.empty(); });
  return state_.stage_token;
}

bool ControllerLink::RegisterWithBackoff(absl::Duration* heartbeat_interval) {
  absl::Duration backoff = options_.initial_backoff;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return false;
    }
    v1::RegisterWorkerRequest request;
    request.set_worker_id(state().worker_id);
    request.set_address(advertised_address_);
    *request.mutable_capacity() = capacity_;
    request.mutable_capacity()->set_memory_free_bytes(FreeDeviceMemory(capacity_));
    request.set_worker_version("0.1.0");
    request.set_instance_id(instance_id_);
    v1::RegisterWorkerReply reply;
    grpc::ClientContext context;
    AttachToken(&context, options_.token);
    context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    grpc::Status status = registry_->RegisterWorker(&context, request, &reply);
    if (status.ok()) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        state_.registered = true;
        state_.incarnation = reply.incarnation();
        state_.stage_token = reply.stage_token();
      }
      wake_.notify_all();
      *heartbeat_interval = absl::Milliseconds(std::max<int64_t>(reply.heartbeat_interval_ms(), 10));
      RLOG(INFO) << "registered as " << request.worker_id() << " (incarnation "
                << reply.incarnation() << ", heartbeat every "
                << absl::FormatDuration(*heartbeat_interval) << ")";
      return true;
    }
    if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
        status.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
        status.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
      RLOG_EVERY_N_SEC(ERROR, 10) << "controller refused registration: " << status.error_message();
    } else {
      RLOG_EVERY_N_SEC(WARNING, 10) << "cannot register (" << status.error_message()
                                   << "); retrying with backoff";
    }
    if (!SleepFor(backoff)) return false;
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

void ControllerLink::Run() {
  absl::Duration interval;
  while (RegisterWithBackoff(&interval)) {
    // Heartbeat until the controller stops recognising this incarnation.
    while (SleepFor(interval)) {
      v1::HeartbeatRequest request;
      const State current = state();
      request.set_worker_id(current.worker_id);
      request.set_incarnation(current.incarnation);
      request.set_memory_free_bytes(FreeDeviceMemory(capacity_));
      if (options_.hosted) {
        for (v1::JobAttempt& attempt : options_.hosted())
          *request.add_hosted() = std::move(attempt);
      }
      v1::HeartbeatReply reply;
      grpc::ClientContext context;
      AttachToken(&context, options_.token);
      context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
      const auto sent = std::chrono::steady_clock::now();
      grpc::Status status = registry_->Heartbeat(&context, request, &reply);
      if (status.ok()) {
        if (options_.on_heartbeat) options_.on_heartbeat(reply, sent);
        continue;
      }
      if (status.error_code() == grpc::StatusCode::NOT_FOUND ||
          status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
        RLOG(WARNING) << "controller no longer knows this worker (" << status.error_message()
                     << "); registering again";
        break;
      }
      // The controller may be restarting: keep heartbeating; it answers NOT_FOUND once back.
      RLOG_EVERY_N_SEC(WARNING, 10) << "heartbeat failed: " << status.error_message();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    state_.registered = false;
  }
}

}  // namespace rlhfd::worker
