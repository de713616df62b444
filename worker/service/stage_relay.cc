#include "worker/service/stage_relay.h"

#include <grpcpp/grpcpp.h>

#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "common/rpc/auth.h"
#include "common/stages/stage_service.h"

namespace rlhfd::worker {
namespace {

bool IsStage(std::string_view name) {
#define RLHFD_STAGE_NAMED(Name, Request, Reply) \
  if (name == #Name) return true;
  RLHFD_STAGES(RLHFD_STAGE_NAMED)
#undef RLHFD_STAGE_NAMED
  return false;
}

// One relay's calls. Every call's context lives here, so a Cancel (the controller gave up on
// the relay) reaches each of them; the gRPC callbacks hold this object until they have run.
class Calls final : public RelayedCalls {
 public:
  struct Call {
    grpc::ClientContext context;
    grpc::ByteBuffer request, reply;
    std::shared_ptr<grpc::GenericStub> stub;
  };

  Calls(std::string method, size_t count, int64_t max_reply_bytes,
        std::shared_ptr<std::atomic<int64_t>> held, std::function<void(v1::RelayReply)> done)
      : method_(std::move(method)),
        max_reply_bytes_(max_reply_bytes),
        held_(std::move(held)),
        left_(count),
        done_(std::move(done)) {
    ++*held_;
    for (size_t i = 0; i < count; ++i) {
      calls_.push_back(std::make_unique<Call>());
      reply_.add_replies();
    }
  }

  ~Calls() override { --*held_; }

  Call& call(size_t i) { return *calls_[i]; }

  // Starts every call; `self` is this object, kept alive by the callbacks.
  static void StartAll(const std::shared_ptr<Calls>& self) {
    for (size_t i = 0; i < self->calls_.size(); ++i) {
      Call& call = *self->calls_[i];
      call.stub->UnaryCall(&call.context, self->method_, grpc::StubOptions(), &call.request,
                           &call.reply,
                           [self, i](grpc::Status status) { self->Answered(i, status); });
    }
  }

  void Cancel() override {
    for (auto& call : calls_) call->context.TryCancel();
  }

 private:
  void Answered(size_t i, const grpc::Status& status) {
    std::unique_lock<std::mutex> lock(mutex_);
    --left_;
    if (finished_) return;
    v1::RelayedReply& out = *reply_.mutable_replies(static_cast<int>(i));
    out.set_answered(true);
    const absl::Status result = Read(status, calls_[i]->reply, *out.mutable_reply());
    out.set_code(static_cast<int>(result.code()));
    out.set_message(std::string(result.message()));
    // A failure other than the deadline ends the stage at the controller: answer now (the other
    // calls go on, as a direct fan-out's would, until the job's end interrupts them). Past the
    // deadline every call ends within moments, and the controller names those that did not answer.
    const bool failed = !result.ok() && !absl::IsDeadlineExceeded(result);
    if (left_ > 0 && !failed) return;
    finished_ = true;
    v1::RelayReply reply = std::move(reply_);
    std::function<void(v1::RelayReply)> done = std::move(done_);
    lock.unlock();
    done(std::move(reply));
  }

  // The call's outcome, its reply's bytes appended to `bytes` when it succeeded. With the mutex.
  absl::Status Read(const grpc::Status& status, grpc::ByteBuffer& reply, std::string& bytes) {
    if (!status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          status.error_message());
    }
    std::vector<grpc::Slice> slices;
    if (!reply.Dump(&slices).ok()) return absl::InternalError("the relay could not read a reply");
    size_t size = 0;
    for (const grpc::Slice& slice : slices) size += slice.size();
    // The relay's answer carries the group's replies together, within what one reply may carry.
    if (reply_bytes_ + size + (size_t{64} << 10) > static_cast<size_t>(max_reply_bytes_)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "its reply (", size, " bytes) would take its relay's answer past the ",
          max_reply_bytes_ >> 20,
          " MiB one reply may carry: run the controller with a higher --stage_relay_above "
          "(or 0) for stages with replies this large"));
    }
    reply_bytes_ += size;
    for (const grpc::Slice& slice : slices) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    return absl::OkStatus();
  }

  const std::string method_;
  const int64_t max_reply_bytes_;
  const std::shared_ptr<std::atomic<int64_t>> held_;
  std::vector<std::unique_ptr<Call>> calls_;
  std::mutex mutex_;
  size_t left_;
  size_t reply_bytes_ = 0;
  bool finished_ = false;
  v1::RelayReply reply_;
  std::function<void(v1::RelayReply)> done_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::GenericStub>> StageRelay::StubFor(const std::string& address) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = stubs_.find(address); it != stubs_.end()) return it->second;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(address, options_);
  if (!channel.ok()) return channel.status();
  // A cluster's workers are a bounded set; a controller that moved on from many leaves stale
  // entries, dropped all at once past a cluster's size.
  if (stubs_.size() >= 16384) stubs_.clear();
  auto stub = std::make_shared<grpc::GenericStub>(*std::move(channel));
  stubs_.emplace(address, stub);
  return stub;
}

absl::StatusOr<std::shared_ptr<RelayedCalls>> StageRelay::Start(
    const v1::RelayRequest& request, absl::Duration deadline, const std::string& token,
    std::function<void(v1::RelayReply)> done) {
  if (!IsStage(request.stage())) {
    return absl::InvalidArgumentError(
        absl::StrCat("Relay: '", request.stage().substr(0, 64), "' is no stage of WorkerService"));
  }
  if (request.calls().empty()) return absl::InvalidArgumentError("Relay: no calls to make");
  auto calls = std::make_shared<Calls>(absl::StrCat("/rlhfd.v1.WorkerService/", request.stage()),
                                       request.calls_size(), options_.max_reply_bytes, relays_held_,
                                       std::move(done));
  const auto ends = absl::ToChronoTime(absl::Now() + deadline - stages::RelayCallMargin(deadline));
  for (int i = 0; i < request.calls_size(); ++i) {
    const v1::RelayedCall& relayed = request.calls(i);
    absl::StatusOr<std::shared_ptr<grpc::GenericStub>> stub = StubFor(relayed.address());
    if (!stub.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("Relay: call ", i, " to '",
                                                     relayed.address().substr(0, 128),
                                                     "': ", stub.status().message()));
    }
    Calls::Call& call = calls->call(static_cast<size_t>(i));
    call.stub = *std::move(stub);
    grpc::Slice slice(relayed.request().data(), relayed.request().size());
    call.request = grpc::ByteBuffer(&slice, 1);
    AttachToken(&call.context, token);
    call.context.set_deadline(ends);
  }
  if (!logged_.exchange(true)) {
    RLOG(INFO) << "relaying stage calls for the controller (the first: " << request.stage()
               << " to " << request.calls_size() << " ranks; later ones are not logged)";
  }
  Calls::StartAll(calls);
  return calls;
}

}  // namespace rlhfd::worker
