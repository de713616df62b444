// Fan-out through the workers (PoolCalls with relay_above, WorkerService.Relay, StageRelay), over
// real gRPC servers on loopback: each worker is the worker's own WorkerServiceImpl in front of a
// scripted StageService. What is shown: a relayed fan-out reaches each rank once, with its own
// request and the stage's own method, and gives the replies a direct fan-out gives, in order,
// with about √n calls from the driver; a failing rank is named as itself; past the stage deadline
// a hung rank is named alone, and a hung relaying worker names its group; a relay's state goes
// with its answer; replies past one answer's cap fail clearly; the job's end is never relayed; a
// relay refuses a wrong token and anything but a stage; cancelling a relay cancels its calls.
#include "worker/service/stage_relay.h"

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/rpc/auth.h"
#include "common/rpc/grpc_options.h"
#include "common/stages/stage_service.h"
#include "controller/driver/job_stages.h"
#include "controller/driver/pool_calls.h"
#include "rlhfd/v1/worker_service.grpc.pb.h"
#include "worker/service/worker_service.h"

namespace rlhfd {
namespace {

constexpr char kToken[] = "relay-test-token";

// One worker's stages: an update answers with the worker's index, the step it was asked for and
// which update it was; other stages answer empty. A worker told to fail or to hold its updates
// does so.
class ScriptedStages final : public stages::StageService {
 public:
  explicit ScriptedStages(int index) : index_(index) {}
  ~ScriptedStages() override { Release(); }

#define RLHFD_SCRIPTED_STAGE(Name, Request, Reply)                                         \
  void Name(const v1::Request& request, absl::Duration, stages::StageDone<v1::Reply> done) \
      override {                                                                           \
    ++calls;                                                                               \
    Answer(#Name, request, std::move(done));                                               \
  }
  RLHFD_STAGES(RLHFD_SCRIPTED_STAGE)
#undef RLHFD_SCRIPTED_STAGE

  void Release() {
    std::vector<stages::StageDone<v1::UpdateReply>> held;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      held.swap(held_);
    }
    for (auto& done : held) done(v1::UpdateReply());
  }

  std::atomic<int> calls{0};
  std::string fail_with;  // set before the fan-out: its updates fail with this
  bool hold = false;      // set before the fan-out: its updates wait for Release

 private:
  template <typename Request, typename Reply>
  void Answer(const char* name, const Request& request, stages::StageDone<Reply> done) {
    if constexpr (std::is_same_v<Reply, v1::UpdateReply>) {
      if (!fail_with.empty()) return done(absl::FailedPreconditionError(fail_with));
      if (hold) {
        std::lock_guard<std::mutex> lock(mutex_);
        held_.push_back(std::move(done));
        return;
      }
      v1::UpdateReply reply;
      (*reply.mutable_metrics())["worker"] = index_;
      (*reply.mutable_metrics())["step"] = static_cast<double>(request.key().step());
      (*reply.mutable_metrics())["critic"] = std::string_view(name) == "UpdateCritic" ? 1 : 0;
      reply.set_optimizer_steps(request.optimizer_steps_before() + 1);
      done(std::move(reply));
    } else {
      (void)name;
      (void)request;
      done(Reply());
    }
  }

  const int index_;
  std::mutex mutex_;
  std::vector<stages::StageDone<v1::UpdateReply>> held_;
};

// The driver's client of one rank, counting the calls it makes directly and the relays.
class CountingStages final : public stages::StageService {
 public:
  explicit CountingStages(std::unique_ptr<stages::StageService> inner) : inner_(std::move(inner)) {}
#define RLHFD_COUNTED_STAGE(Name, Request, Reply)                \
  void Name(const v1::Request& request, absl::Duration deadline, \
            stages::StageDone<v1::Reply> done) override {        \
    ++(std::string_view(#Name) == "Relay" ? relays : direct);    \
    inner_->Name(request, deadline, std::move(done));            \
  }
  RLHFD_STAGES(RLHFD_COUNTED_STAGE)
  RLHFD_COUNTED_STAGE(Relay, RelayRequest, RelayReply)
#undef RLHFD_COUNTED_STAGE
  void CancelCalls() override { inner_->CancelCalls(); }

  std::atomic<int> direct{0}, relays{0};

 private:
  std::unique_ptr<stages::StageService> inner_;
};

// A port that takes connections and never answers: a worker hung (SIGSTOP) as its peers see it.
class SilentPort {
 public:
  SilentPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
    REQUIRE(::listen(fd_, 64) == 0);
    socklen_t length = sizeof(address);
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    port_ = ntohs(address.sin_port);
  }
  ~SilentPort() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// `count` workers on loopback and the driver's clients of them.
class Workers {
 public:
  explicit Workers(int count, RpcOptions relay_options = {}) : relay_(relay_options) {
    for (int i = 0; i < count; ++i) {
      stages_.push_back(std::make_unique<ScriptedStages>(i));
      services_.push_back(std::make_unique<worker::WorkerServiceImpl>(
          nullptr, stages_.back().get(), &relay_, [] { return worker::HostedStatus{}; },
          [] { return std::string(kToken); }, 0));
      int port = 0;
      grpc::ServerBuilder builder;
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
      builder.RegisterService(services_.back().get());
      servers_.push_back(builder.BuildAndStart());
      REQUIRE(servers_.back() != nullptr);
      addresses.push_back(absl::StrCat("127.0.0.1:", port));
    }
    for (int i = 0; i < count; ++i) Connect(i, addresses[i]);
  }
  ~Workers() {
    for (auto& worker : stages_) worker->Release();
    clients.clear();
    for (auto& server : servers_) server->Shutdown(std::chrono::system_clock::now());
  }

  // The driver reaches rank `i` at `address` (its relays included).
  void Connect(int i, const std::string& address) {
    auto channel = MakeChannel(address, RpcOptions{});
    REQUIRE(channel.ok());
    auto client = std::make_unique<CountingStages>(stages::MakeGrpcStageService(*channel, kToken));
    if (i < static_cast<int>(clients.size())) {
      clients[i] = std::move(client);
    } else {
      clients.push_back(std::move(client));
    }
  }

  controller::PoolCalls Calls(int relay_above, absl::Duration deadline = absl::Seconds(20)) {
    std::vector<stages::StageService*> ranks;
    for (auto& client : clients) ranks.push_back(client.get());
    return controller::PoolCalls("job-relay", ranks, {},
                                 {.stage_deadline = deadline,
                                  .rank_names = {},
                                  .relay_above = relay_above,
                                  .rank_addresses = addresses});
  }
  ScriptedStages& worker(int i) { return *stages_[i]; }
  const worker::StageRelay& relay() const { return relay_; }
  int direct_calls() const {
    int sum = 0;
    for (auto& client : clients) sum += client->direct;
    return sum;
  }
  int relays() const {
    int sum = 0;
    for (auto& client : clients) sum += client->relays;
    return sum;
  }

  std::vector<std::string> addresses;
  std::vector<std::unique_ptr<CountingStages>> clients;

 private:
  worker::StageRelay relay_;
  std::vector<std::unique_ptr<ScriptedStages>> stages_;
  std::vector<std::unique_ptr<worker::WorkerServiceImpl>> services_;
  std::vector<std::unique_ptr<grpc::Server>> servers_;
};

std::vector<int> Ranks(int count) {
  std::vector<int> ranks(count);
  for (int i = 0; i < count; ++i) ranks[i] = i;
  return ranks;
}

absl::StatusOr<std::vector<v1::UpdateReply>> Update(
    const controller::PoolCalls& calls, const std::vector<int>& ranks,
    controller::StageMethod<v1::UpdateRequest, v1::UpdateReply> method =
        &stages::StageService::UpdateActor) {
  return calls.FanOut<v1::UpdateRequest, v1::UpdateReply>(ranks, method, [&](int rank, int) {
    v1::UpdateRequest request;
    *request.mutable_key() = calls.Key(100 + rank, "update");  // each rank its own step
    request.set_optimizer_steps_before(10 * rank);
    return request;
  });
}

TEST_CASE("A relayed fan-out gives every rank its own call and the direct fan-out's replies",
          "[relay]") {
  Workers workers(11);
  const std::vector<int> ranks = Ranks(11);
  for (const bool relayed : {false, true}) {
    CAPTURE(relayed);
    const int direct_before = workers.direct_calls(), relays_before = workers.relays();
    for (const auto method :
         {&stages::StageService::UpdateActor, &stages::StageService::UpdateCritic}) {
      const controller::PoolCalls calls = workers.Calls(relayed ? 3 : 0);
      absl::StatusOr<std::vector<v1::UpdateReply>> replies = Update(calls, ranks, method);
      REQUIRE(replies.ok());
      REQUIRE(replies->size() == 11);
      for (int rank = 0; rank < 11; ++rank) {
        const v1::UpdateReply& reply = (*replies)[rank];
        CHECK(reply.metrics().at("worker") == rank);
        CHECK(reply.metrics().at("step") == 100 + rank);
        CHECK(reply.metrics().at("critic") == (method == &stages::StageService::UpdateCritic));
        CHECK(reply.optimizer_steps() == 10 * rank + 1);
      }
    }
    for (int rank = 0; rank < 11; ++rank) {
      CHECK(workers.worker(rank).calls == (relayed ? 4 : 2));  // once per fan-out each time
    }
    if (relayed) {
      // ⌈√11⌉ = 4 ranks a group: 0-3, 4-7, 8-10; three relays per fan-out, nothing direct.
      CHECK(workers.relays() - relays_before == 6);
      CHECK(workers.direct_calls() - direct_before == 0);
    } else {
      CHECK(workers.relays() - relays_before == 0);
      CHECK(workers.direct_calls() - direct_before == 22);
    }
  }

  SECTION("a fan-out to no more ranks than relay_above goes directly") {
    const controller::PoolCalls calls = workers.Calls(3);
    const int relays_before = workers.relays();
    REQUIRE(Update(calls, {2, 5, 9}).ok());
    CHECK(workers.relays() == relays_before);
  }
}

TEST_CASE("A rank that fails a relayed stage is named as itself", "[relay]") {
  Workers workers(9);
  workers.worker(5).fail_with = "the batch of rank 5 is wrong";
  const controller::PoolCalls calls = workers.Calls(2);
  absl::StatusOr<std::vector<v1::UpdateReply>> replies = Update(calls, Ranks(9));
  REQUIRE(absl::IsFailedPrecondition(replies.status()));
  CHECK(absl::StrContains(replies.status().message(), "rank 5: the batch of rank 5 is wrong"));
}

TEST_CASE("Past the stage deadline a relayed fan-out names the ranks that did not answer",
          "[relay]") {
  Workers workers(9);  // groups of 3: 0-2, 3-5, 6-8
  SECTION("a hung rank is named alone; the relay of its group answers for the others") {
    workers.worker(4).hold = true;
    const controller::PoolCalls calls = workers.Calls(2, absl::Seconds(2));
    absl::StatusOr<std::vector<v1::UpdateReply>> replies = Update(calls, Ranks(9));
    REQUIRE(absl::IsDeadlineExceeded(replies.status()));
    CHECK(absl::StrContains(replies.status().message(), "from rank 4:"));
    CHECK(calls.unanswered() == std::vector<int>{4});
  }
  SECTION("a hung relaying worker is named with its group") {
    const SilentPort silent;
    workers.Connect(3, absl::StrCat("127.0.0.1:", silent.port()));
    const controller::PoolCalls calls = workers.Calls(2, absl::Seconds(2));
    absl::StatusOr<std::vector<v1::UpdateReply>> replies = Update(calls, Ranks(9));
    REQUIRE(absl::IsDeadlineExceeded(replies.status()));
    CHECK(calls.unanswered() == std::vector<int>{3, 4, 5});
  }
}

TEST_CASE("A relay's state is let go once it has answered", "[relay]") {
  // Each relay holds its calls' contexts and buffers; a relaying worker of a long job makes
  // thousands, so none may outlive its answer (answered, failed or cancelled).
  Workers workers(9);
  const controller::PoolCalls calls = workers.Calls(2);
  for (int round = 0; round < 5; ++round) REQUIRE(Update(calls, Ranks(9)).ok());
  workers.worker(7).fail_with = "a bad batch";
  CHECK_FALSE(Update(calls, Ranks(9)).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (workers.relay().relays_held() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(workers.relay().relays_held() == 0);
}

TEST_CASE("Replies past what one relay's answer may carry fail the stage, naming the flag",
          "[relay]") {
  // 64 KiB of headroom plus 100 bytes: two of the scripted replies fit, the third does not.
  Workers workers(4, RpcOptions{.max_reply_bytes = (64 << 10) + 100});
  const controller::PoolCalls calls = workers.Calls(2);
  absl::StatusOr<std::vector<v1::UpdateReply>> replies = Update(calls, Ranks(4));
  REQUIRE(absl::IsResourceExhausted(replies.status()));
  CHECK(absl::StrContains(replies.status().message(), "--stage_relay_above"));
}

TEST_CASE("The job's end reaches every rank directly, past relay_above too", "[relay]") {
  // EndJob is what frees a job's memory on each worker; the worker that would relay a group's
  // calls may be the one that is gone.
  Workers workers(8);
  const SilentPort silent;
  workers.Connect(0, absl::StrCat("127.0.0.1:", silent.port()));
  std::vector<stages::StageService*> ranks;
  for (auto& client : workers.clients) ranks.push_back(client.get());
  v1::JobSpec spec;
  spec.mutable_roles()->mutable_actor()->set_gpus(8);
  controller::JobStages job("job-relay", spec, ranks,
                            {.relay_above = 2, .rank_addresses = workers.addresses});
  job.End(absl::Seconds(2));
  CHECK(workers.relays() == 0);
  for (int rank = 1; rank < 8; ++rank) CHECK(workers.worker(rank).calls == 1);
}

TEST_CASE("Relay refuses a wrong token and anything that is not a stage", "[relay]") {
  Workers workers(2);
  auto channel = MakeChannel(workers.addresses[0], RpcOptions{});
  REQUIRE(channel.ok());
  auto stub = v1::WorkerService::NewStub(*channel);
  const auto relay = [&](const std::string& stage, const std::string& token) {
    v1::RelayRequest request;
    request.set_stage(stage);
    v1::RelayedCall& call = *request.add_calls();
    call.set_address(workers.addresses[1]);
    v1::UpdateRequest update;
    *update.mutable_key() = workers.Calls(0).Key(1, "update");
    call.set_request(update.SerializeAsString());
    grpc::ClientContext context;
    AttachToken(&context, token);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::RelayReply reply;
    const grpc::Status status = stub->Relay(&context, request, &reply);
    return std::make_pair(status, reply);
  };
  CHECK(relay("UpdateActor", "not-the-token").first.error_code() ==
        grpc::StatusCode::UNAUTHENTICATED);
  for (const std::string stage : {"GetWorkerStatus", "Relay", "", "UpdateActor/../Relay"}) {
    CAPTURE(stage);
    const auto [status, reply] = relay(stage, kToken);
    CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  }
  CHECK(workers.worker(1).calls == 0);
  const auto [status, reply] = relay("UpdateActor", kToken);
  REQUIRE(status.ok());
  REQUIRE(reply.replies_size() == 1);
  CHECK(reply.replies(0).answered());
  CHECK(reply.replies(0).code() == 0);
  CHECK(workers.worker(1).calls == 1);
}

TEST_CASE("Cancelling a relay cancels the calls it made", "[relay]") {
  Workers workers(2);
  workers.worker(1).hold = true;
  worker::StageRelay relay(RpcOptions{});
  v1::RelayRequest request;
  request.set_stage("UpdateActor");
  for (int i = 0; i < 2; ++i) {
    v1::RelayedCall& call = *request.add_calls();
    call.set_address(workers.addresses[i]);
    v1::UpdateRequest update;
    *update.mutable_key() = workers.Calls(0).Key(1, "update");
    call.set_request(update.SerializeAsString());
  }
  absl::Notification answered;
  v1::RelayReply got;
  absl::StatusOr<std::shared_ptr<worker::RelayedCalls>> calls =
      relay.Start(request, absl::Seconds(30), kToken, [&](v1::RelayReply reply) {
        got = std::move(reply);
        answered.Notify();
      });
  REQUIRE(calls.ok());
  CHECK_FALSE(answered.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  (*calls)->Cancel();
  REQUIRE(answered.WaitForNotificationWithTimeout(absl::Seconds(5)));
  REQUIRE(got.replies_size() == 2);
  CHECK(got.replies(0).code() == 0);
  CHECK(got.replies(1).answered());
  CHECK(got.replies(1).code() == static_cast<int>(grpc::StatusCode::CANCELLED));
}

}  // namespace
}  // namespace rlhfd
