// Hostile input against a real rlhfd-controller over gRPC: every request that once crashed or
// stalled it, and a corpus of malformed configs and fields. Each must be answered (refused with
// a reason, or accepted) within a second, the controller must keep serving, and its memory must
// come back near where it started.
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/rpc/auth.h"
#include "common/util/files.h"
#include "rlhfd/v1/cluster_service.grpc.pb.h"
#include "rlhfd/v1/job_service.grpc.pb.h"
#include "rlhfd/v1/worker_service.grpc.pb.h"
#include "tests/support/cluster_fixture.h"

namespace rlhfd::testing {
namespace {

LocalClusterBinaries Binaries() { return {RLHFD_CONTROLLER_BIN, RLHFD_WORKER_BIN, RLHFD_CTL_BIN}; }

// Time bounds say "answered, not held": a held call runs into its deadline, an answered one ends
// well before it even while other processes load both cores (CI's machine has two), so the bound
// sits between the two instead of at what an idle machine meets.
constexpr absl::Duration kCallDeadline = absl::Seconds(20);
constexpr absl::Duration kAnswered = absl::Seconds(5);

// Resident memory of a process, from /proc.
int64_t ResidentBytes(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      int64_t kib = 0;
      std::string digits;
      for (char c : line) {
        if (c >= '0' && c <= '9') digits += c;
      }
      return absl::SimpleAtoi(digits, &kib) ? kib * 1024 : -1;
    }
  }
  return -1;
}

const std::string kValidConfig = std::string(R"(name: hostile-baseline
model: {path: )") + RLHFD_FIXTURES_DIR + R"(/models/tiny-qwen2}
data: {train_files: [)" + RLHFD_FIXTURES_DIR + R"(/data/arithmetic_train.jsonl], train_batch_size: 8}
algorithm: {adv_estimator: grpo, kl: {mode: loss}}
roles:
  actor: {gpus: 1, train: {ppo_mini_batch_size: 4, ppo_micro_batch_size_per_gpu: 2}, rollout: {n: 2}}
  reference: {}
  reward: {rule: gsm8k}
)";

std::string Repeat(const std::string& piece, size_t times) {
  std::string out;
  out.reserve(piece.size() * times);
  for (size_t i = 0; i < times; ++i) out += piece;
  return out;
}

// A YAML document whose aliases expand to `width`^`levels` scalars from a kilobyte of text.
std::string AliasBomb(int width, int levels) {
  std::string text = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int level = 1; level < levels; ++level) {
    absl::StrAppend(&text, "a", level, ": &a", level, " [");
    for (int i = 0; i < width; ++i) absl::StrAppend(&text, i ? ", " : "", "*a", level - 1);
    absl::StrAppend(&text, "]\n");
  }
  return text;
}

std::string RandomBytes(size_t size, uint32_t seed) {
  std::mt19937 random(seed);
  std::string out(size, '\0');
  for (char& c : out) c = static_cast<char>(random() & 0xFF);
  return out;
}

struct Outcome {
  grpc::Status status;
  absl::Duration took;
};

class HostileClient {
 public:
  HostileClient(const std::string& address, std::string token) : token_(std::move(token)) {
    grpc::ChannelArguments arguments;
    arguments.SetMaxSendMessageSize(512 << 20);
    arguments.SetMaxReceiveMessageSize(64 << 20);
    channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), arguments);
    jobs_ = v1::JobService::NewStub(channel_);
    cluster_ = v1::ClusterService::NewStub(channel_);
    registry_ = v1::WorkerRegistry::NewStub(channel_);
  }

  template <typename Call>
  Outcome Timed(Call call, bool with_token = true, absl::Duration deadline = kCallDeadline) {
    grpc::ClientContext context;
    if (with_token) AttachToken(&context, token_);
    context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    const absl::Time start = absl::Now();
    grpc::Status status = call(&context);
    return {status, absl::Now() - start};
  }

  Outcome Submit(const std::string& text, const std::string& name, bool with_token = true,
                 absl::Duration deadline = kCallDeadline) {
    v1::SubmitJobRequest request;
    request.set_config_text(text);
    request.set_config_name(name);
    return Timed(
        [&](grpc::ClientContext* context) {
          v1::SubmitJobReply reply;
          return jobs_->SubmitJob(context, request, &reply);
        },
        with_token, deadline);
  }
  Outcome SubmitSpec(const v1::JobSpec& spec) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    return Timed([&](grpc::ClientContext* context) {
      v1::SubmitJobReply reply;
      return jobs_->SubmitJob(context, request, &reply);
    });
  }
  Outcome GetJob(const std::string& id) {
    v1::GetJobRequest request;
    request.set_job_id(id);
    return Timed([&](grpc::ClientContext* context) {
      v1::GetJobReply reply;
      return jobs_->GetJob(context, request, &reply);
    });
  }
  Outcome ListJobs(int states) {
    v1::ListJobsRequest request;
    for (int i = 0; i < states; ++i) request.add_states(v1::JOB_STATE_QUEUED);
    return Timed([&](grpc::ClientContext* context) {
      v1::ListJobsReply reply;
      return jobs_->ListJobs(context, request, &reply);
    });
  }
  Outcome Register(const v1::RegisterWorkerRequest& request) {
    return Timed([&](grpc::ClientContext* context) {
      v1::RegisterWorkerReply reply;
      return registry_->RegisterWorker(context, request, &reply);
    });
  }
  Outcome Heartbeat(const v1::HeartbeatRequest& request) {
    return Timed([&](grpc::ClientContext* context) {
      v1::HeartbeatReply reply;
      return registry_->Heartbeat(context, request, &reply);
    });
  }
  Outcome Drain(const std::string& id) {
    v1::DrainWorkerRequest request;
    request.set_worker_id(id);
    return Timed([&](grpc::ClientContext* context) {
      v1::DrainWorkerReply reply;
      return cluster_->DrainWorker(context, request, &reply);
    });
  }
  bool Serving() {
    return Timed([&](grpc::ClientContext* context) {
             v1::GetClusterReply reply;
             return cluster_->GetCluster(context, {}, &reply);
           })
        .status.ok();
  }

  v1::JobService::Stub& jobs() { return *jobs_; }

 private:
  std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::ClusterService::Stub> cluster_;
  std::unique_ptr<v1::WorkerRegistry::Stub> registry_;
};

v1::RegisterWorkerRequest Worker(const std::string& id) {
  v1::RegisterWorkerRequest request;
  request.set_worker_id(id);
  request.set_address("127.0.0.1:7000");
  request.set_instance_id("hostile");
  request.mutable_capacity()->set_device_kind(v1::DEVICE_KIND_CPU);
  request.mutable_capacity()->set_device_index(-1);
  request.mutable_capacity()->set_memory_total_bytes(1 << 30);
  return request;
}

}  // namespace

TEST_CASE("no request ends, stalls or bloats the controller", "[integration][hostile]") {
  LocalCluster cluster(Binaries(), absl::Milliseconds(200), absl::Seconds(2));
  // The REST gateway too: the config corpus goes through POST /v1/jobs as well.
  cluster.SetExtraFlags({"--http_listen=127.0.0.1:0",
                         "--http_port_file=" + cluster.state_dir() + "/http.port"},
                        {});
  std::string error;
  REQUIRE(cluster.StartController(&error));
  auto token = ReadFileToString(cluster.state_dir() + "/token");
  REQUIRE(token.ok());
  HostileClient client(cluster.address(), std::string(absl::StripAsciiWhitespace(*token)));
  REQUIRE(client.Submit(kValidConfig, "baseline.yaml").status.ok());
  const pid_t pid = cluster.controller()->pid();
  const int64_t memory_before = ResidentBytes(pid);

  struct Case {
    std::string name;
    std::function<Outcome()> send;
    // Expected outcome: a code (refused with a reason) or OK (accepted).
    grpc::StatusCode code;
  };
  const std::string valid = kValidConfig;
  const auto with = [&](const std::string& from, const std::string& to) {
    return absl::StrReplaceAll(valid, {{from, to}});
  };
  std::vector<std::pair<std::string, std::string>> configs;  // (text, name), for REST below
  const auto yaml = [&](std::string text) {
    configs.emplace_back(text, "h.yaml");
    return std::function<Outcome()>([&client, text] { return client.Submit(text, "h.yaml"); });
  };
  const auto json = [&](std::string text) {
    configs.emplace_back(text, "h.json");
    return std::function<Outcome()>([&client, text] { return client.Submit(text, "h.json"); });
  };
  const grpc::StatusCode kInvalid = grpc::INVALID_ARGUMENT;
  std::vector<Case> cases = {
      // The crashes and stalls found in review.
      {"YAML \\_ escape (raw 0xA0)", yaml(with("name: hostile-baseline", "name: \"\\_\"")), kInvalid},
      {"YAML \\N escape (raw 0x85)", yaml(with("name: hostile-baseline", "name: \"\\N\"")), kInvalid},
      {"JSON nested 60000 deep", json(Repeat("{\"a\":", 60000) + "1" + Repeat("}", 60000)), kInvalid},
      {"JSON number past double", json(R"({"name": "x", "roles": {"actor": {"train": {"lr": 1e400}}}})"), kInvalid},
      {"YAML alias bomb to 4.3e7 scalars", yaml(AliasBomb(10, 8)), kInvalid},
      {"YAML alias bomb to 1e8 scalars", yaml(AliasBomb(10, 9)), kInvalid},
      {"config_name of 3 MB", [&] { return client.Submit(valid, std::string(3 << 20, 'n')); }, kInvalid},
      {"config_name of 70 MB", [&] { return client.Submit(valid, std::string(70 << 20, 'n')); },
       grpc::RESOURCE_EXHAUSTED},
      {"device_name of 100 MB",
       [&] {
         auto request = Worker("big-name");
         request.mutable_capacity()->set_device_name(std::string(100 << 20, 'd'));
         return client.Register(request);
       },
       grpc::RESOURCE_EXHAUSTED},
      {"device_name of 3 MB",
       [&] {
         auto request = Worker("big-name");
         request.mutable_capacity()->set_device_name(std::string(3 << 20, 'd'));
         return client.Register(request);
       },
       kInvalid},
      {"job id job-01", [&] { return client.GetJob("job-01"); }, grpc::NOT_FOUND},
      {"job id job-+1", [&] { return client.GetJob("job-+1"); }, grpc::NOT_FOUND},
      {"job id 'job- 1'", [&] { return client.GetJob("job- 1"); }, grpc::NOT_FOUND},
      {"job id job-1\\n", [&] { return client.GetJob("job-1\n"); }, grpc::NOT_FOUND},
      {"dp * tp overflowing int32",
       yaml(with("train: {", "train: {dp: -2147483647, tp: 2, ")), kInvalid},
      {"train_batch_size INT_MAX", yaml(with("train_batch_size: 8", "train_batch_size: 2147483647")),
       kInvalid},
      {"negative worker memory",
       [&] {
         auto request = Worker("neg-mem");
         request.mutable_capacity()->set_memory_total_bytes(-1);
         return client.Register(request);
       },
       kInvalid},
      {"unknown device kind",
       [&] {
         auto request = Worker("odd-kind");
         request.mutable_capacity()->set_device_kind(static_cast<v1::DeviceKind>(99));
         return client.Register(request);
       },
       kInvalid},
      {"address not host:port",
       [&] {
         auto request = Worker("no-port");
         request.set_address("just-a-host");
         return client.Register(request);
       },
       kInvalid},
      // More malformed configs.
      {"invalid UTF-8 in a YAML key", yaml("na\xff\xfeme: x\n"), kInvalid},
      {"invalid UTF-8 in a YAML value", yaml(with("name: hostile-baseline", "name: \xc0\xaf")), kInvalid},
      {"invalid UTF-8 in a JSON value", json("{\"name\": \"\xed\xa0\x80\"}"), kInvalid},
      {"lone surrogate escape in JSON", json(R"({"name": "\ud800"})"), kInvalid},
      {"YAML flow lists 100000 deep", yaml("a: " + Repeat("[", 100000) + Repeat("]", 100000)), kInvalid},
      {"YAML block mappings 1000 deep",
       yaml([] {
         std::string text;
         for (int i = 0; i < 1000; ++i) text += std::string(i, ' ') + "k:\n";
         return text;
       }()),
       kInvalid},
      {"YAML list of 400000 values", yaml("data: {train_files: [" + Repeat("a,", 400000) + "a]}\n"),
       kInvalid},
      {"YAML self-referencing alias", yaml("a: &a [*a]\n"), kInvalid},
      {"YAML merge keys", yaml("base: &b {gpus: 1}\nroles: {actor: {<<: *b}}\n"), kInvalid},
      {"YAML binary tag", yaml(with("name: hostile-baseline", "name: !!binary aGVsbG8=")), kInvalid},
      {"number past int64 (YAML)", yaml(with("gpus: 1", "gpus: 99999999999999999999")), kInvalid},
      {"number past int64 (JSON integer for top_k)",
       json(R"({"roles": {"actor": {"rollout": {"top_k": 18446744073709551615}}}})"), kInvalid},
      {"1e30 for an integer (JSON)", json(R"({"data": {"train_batch_size": 1e30}})"), kInvalid},
      {"NaN and Infinity literals (JSON)", json(R"({"algorithm": {"gamma": NaN}})"), kInvalid},
      {"nan in YAML", yaml(with("adv_estimator: grpo", "adv_estimator: grpo, gamma: .nan")), kInvalid},
      {"1 MB string value", yaml(with("/models/tiny-qwen2", "/" + std::string(900000, 'p'))),
       kInvalid},
      {"10 MB config", yaml(valid + "# " + std::string(10 << 20, 'c') + "\n"),
       grpc::RESOURCE_EXHAUSTED},
      {"duplicate key (YAML)", yaml(valid + "name: again\n"), kInvalid},
      {"duplicate key (JSON)", json(R"({"name": "a", "name": "b"})"), kInvalid},
      {"binary garbage as YAML", yaml(RandomBytes(4096, 1)), kInvalid},
      {"binary garbage as JSON", json(RandomBytes(4096, 2)), kInvalid},
      {"ANSI escape in the job name", yaml(with("name: hostile-baseline", "name: \"a\\e[2Jb\"")),
       kInvalid},
      {"control character in a path",
       yaml(with(std::string("path: ") + RLHFD_FIXTURES_DIR + "/models/tiny-qwen2",
                 "path: \"/m\\x07odel\"")),
       kInvalid},
      {"top level is a list", yaml("- a\n- b\n"), kInvalid},
      {"top level is a string (JSON)", json("\"just text\""), kInvalid},
      {"empty config", yaml(""), kInvalid},
      {"20000 unknown keys", yaml([] {
         std::string text;
         for (int i = 0; i < 20000; ++i) absl::StrAppend(&text, "key", i, ": 1\n");
         return text;
       }()),
       kInvalid},
      {"100 KB key", yaml(std::string(100000, 'k') + ": 1\n"), kInvalid},
      {"config text and spec together",
       [&] {
         v1::SubmitJobRequest request;
         request.set_config_text(valid);
         request.mutable_spec()->set_name("x");
         return client.Timed([&](grpc::ClientContext* context) {
           v1::SubmitJobReply reply;
           return client.jobs().SubmitJob(context, request, &reply);
         });
       },
       kInvalid},
      {"spec with huge repeated field",
       [&] {
         v1::JobSpec spec;
         spec.set_name("x");
         for (int i = 0; i < 200000; ++i) spec.mutable_data()->add_train_files("f");
         return client.SubmitSpec(spec);
       },
       kInvalid},
      {"ListJobs with 500000 states", [&] { return client.ListJobs(500000); }, kInvalid},
      {"heartbeat with negative memory",
       [&] {
         REQUIRE(client.Register(Worker("beat")).status.ok());
         v1::HeartbeatRequest request;
         request.set_worker_id("beat");
         request.set_incarnation(1);
         request.set_memory_free_bytes(-1);
         return client.Heartbeat(request);
       },
       kInvalid},
      {"drain with a 1 MB worker id", [&] { return client.Drain(std::string(1 << 20, 'w')); },
       grpc::NOT_FOUND},
      {"unauthenticated submission", [&] { return client.Submit(valid, "x.yaml", false); },
       grpc::UNAUTHENTICATED},
      // And what must still work.
      {"a valid config", yaml(valid), grpc::OK},
      {"non-ASCII job name (JSON)", json(R"({"name": "ünïcode"})"), kInvalid},
  };
  REQUIRE(cases.size() >= 25 + 16);

  for (Case& c : cases) {
    INFO("case: " << c.name);
    const Outcome outcome = c.send();
    INFO("answer: " << outcome.status.error_code() << " "
                    << outcome.status.error_message().substr(0, 300));
    CHECK(outcome.status.error_code() == c.code);
    if (c.code != grpc::OK && c.code != grpc::RESOURCE_EXHAUSTED) {
      CHECK_FALSE(outcome.status.error_message().empty());
    }
    CHECK(outcome.took < kAnswered);
    REQUIRE(cluster.controller()->running());
    CHECK(client.Serving());
  }

  // Every config of the corpus through the REST gateway: 400 with a message (413 over 1 MiB;
  // the valid one is accepted), within a second, the controller serving.
  auto http_port = ReadFileToString(cluster.state_dir() + "/http.port", 64);
  REQUIRE(http_port.ok());
  httplib::Client rest("127.0.0.1", std::stoi(*http_port));
  rest.set_read_timeout(absl::ToInt64Seconds(kCallDeadline), 0);
  const httplib::Headers auth = {
      {"Authorization", "Bearer " + std::string(absl::StripAsciiWhitespace(*token))}};
  int accepted = 0;
  for (const auto& [text, name] : configs) {
    INFO("REST config of " << text.size() << " bytes: " << absl::CEscape(text.substr(0, 80)));
    const absl::Time start = absl::Now();
    const httplib::Result answer =
        rest.Post(("/v1/jobs?name=" + name).c_str(), auth, text,
                  absl::EndsWith(name, ".json") ? "application/json" : "application/yaml");
    REQUIRE(answer);
    INFO("answer: " << answer->status << " " << answer->body.substr(0, 300));
    const int expected = text.size() > (1u << 20) ? 413 : text == valid ? 200 : 400;
    CHECK(answer->status == expected);
    if (expected == 200) ++accepted;
    if (expected != 200) CHECK(absl::StrContains(answer->body, "\"message\""));
    CHECK(absl::Now() - start < kAnswered);
    REQUIRE(cluster.controller()->running());
  }
  CHECK(accepted == 1);

  // Eight unauthenticated 250 MB messages at once: refused, not held. Sending 2 GB through
  // loopback is the client's own cost, so the deadline allows for a loaded machine; the code (not
  // DEADLINE_EXCEEDED) is what shows the refusal. gRPC reads a message before it can judge its
  // size, within the server's memory quota (256 MiB, RpcOptions::server_memory_bytes): the
  // controller's footprint meanwhile is sampled to show that bound.
  const auto flood = [&] {
    std::atomic<bool> flooding = true;
    int64_t memory_peak = 0;
    std::thread sampler([&] {
      while (flooding) {
        memory_peak = std::max(memory_peak, ResidentBytes(pid));
        absl::SleepFor(absl::Milliseconds(20));
      }
    });
    std::vector<std::thread> floods;
    std::vector<grpc::StatusCode> flood_codes(8);
    for (int i = 0; i < 8; ++i) {
      floods.emplace_back([&, i] {
        HostileClient anonymous(cluster.address(), "");
        flood_codes[i] =
            anonymous.Submit(std::string(250 << 20, 'z'), "flood.yaml", false, absl::Seconds(120))
                .status.error_code();
      });
    }
    for (std::thread& thread : floods) thread.join();
    flooding = false;
    sampler.join();
    INFO("resident memory before " << memory_before << ", at most " << memory_peak
                                   << " during the floods");
    CHECK(memory_peak < memory_before + (512 << 20));
    for (grpc::StatusCode code : flood_codes) CHECK(code == grpc::RESOURCE_EXHAUSTED);
    REQUIRE(cluster.controller()->running());
    CHECK(client.Serving());
  };
  // The pages go back: the controller trims its heap each second once gRPC has torn the streams
  // down, which a loaded machine may take a few seconds to do. Waits up to 20 s for the footprint
  // to fall under `bound`; returns it.
  const auto settled = [&](int64_t bound) {
    int64_t memory = ResidentBytes(pid);
    for (const absl::Time until = absl::Now() + absl::Seconds(20);
         memory >= bound && absl::Now() < until; memory = ResidentBytes(pid)) {
      absl::SleepFor(absl::Milliseconds(200));
    }
    return memory;
  };
  // The first round may leave the allocator's and gRPC's caches warm (96 MB over the start in one
  // CI run on a loaded machine), bounded below the quota; a second round must add nothing
  // lasting: refused floods do not accumulate.
  flood();
  const int64_t memory_after_first = settled(memory_before + (64 << 20));
  INFO("resident memory before " << memory_before << " after the first floods "
                                 << memory_after_first);
  CHECK(memory_after_first < memory_before + (192 << 20));
  flood();
  const int64_t memory_after_second = settled(memory_after_first + (32 << 20));
  INFO("resident memory after the first floods " << memory_after_first << ", after the second "
                                                 << memory_after_second);
  CHECK(memory_after_second < memory_after_first + (32 << 20));

  // Ids: the baseline was job-1, the valid config job-2 (gRPC) and job-3 (REST); the next is job-4.
  v1::SubmitJobRequest next;
  next.set_config_text(kValidConfig);
  grpc::ClientContext context;
  AttachToken(&context, std::string(absl::StripAsciiWhitespace(*token)));
  v1::SubmitJobReply reply;
  REQUIRE(client.jobs().SubmitJob(&context, next, &reply).ok());
  CHECK(reply.job().job_id() == "job-4");
}

TEST_CASE("SIGTERM ends open watch streams and exits within its deadline",
          "[integration][hostile]") {
  LocalCluster cluster(Binaries(), absl::Milliseconds(200), absl::Seconds(2));
  // A drain deadline far above the bound below: streams that held the drain would run into it.
  cluster.SetExtraFlags({"--shutdown_deadline=30s"}, {});
  std::string error;
  REQUIRE(cluster.StartController(&error));
  TempDir dir;
  REQUIRE(WriteFileAtomically(dir.path() + "/watched.yaml", kValidConfig).ok());
  REQUIRE(cluster.Ctl({"submit", dir.path() + "/watched.yaml"}).exit_code == 0);

  // Three rlhfctl processes hold watch streams open on job-1.
  std::vector<std::unique_ptr<Subprocess>> watchers;
  for (int i = 0; i < 3; ++i) {
    watchers.push_back(std::make_unique<Subprocess>(
        std::vector<std::string>{RLHFD_CTL_BIN, "--controller=" + cluster.address(),
                                 "--token_file=" + cluster.state_dir() + "/token", "watch",
                                 "job-1"},
        absl::StrCat(dir.path(), "/watch", i, ".log")));
  }
  for (auto& watcher : watchers) {
    REQUIRE(WaitFor([&] { return watcher->ReadLog().find("queued") != std::string::npos; },
                    absl::Seconds(10)));
  }
  const absl::Time signalled = absl::Now();
  CHECK(cluster.StopController(SIGTERM) == std::optional<int>(0));
  const absl::Duration took = absl::Now() - signalled;
  INFO("shutdown took " << absl::FormatDuration(took));
  CHECK(took < kAnswered);
  for (auto& watcher : watchers) {
    CHECK(watcher->Wait(absl::Seconds(5)) == std::optional<int>(1));
    CHECK_THAT(watcher->ReadLog(), Catch::Contains("shutting down"));
  }
}

TEST_CASE("a second worker under a live worker's id is refused", "[integration][hostile]") {
  LocalCluster cluster(Binaries(), absl::Milliseconds(200), absl::Seconds(2));
  std::string error;
  REQUIRE(cluster.StartController(&error));
  const size_t first = cluster.StartWorker("shared-id");
  REQUIRE(WaitFor([&] { return cluster.Ctl({"workers"}).out.find("shared-id") != std::string::npos; },
                  absl::Seconds(20)));
  const std::string address_before = cluster.Ctl({"--json", "workers"}).out;
  const size_t second = cluster.StartWorker("shared-id");
  REQUIRE(WaitFor(
      [&] {
        return cluster.worker(second).ReadLog().find("in use by a live worker") != std::string::npos;
      },
      absl::Seconds(20)));
  // Several heartbeats later the entry still belongs to the first worker.
  absl::SleepFor(absl::Seconds(1));
  CHECK(cluster.Ctl({"--json", "workers"}).out.find("\"incarnation\": \"1\"") != std::string::npos);
  CHECK(cluster.worker(first).running());
  CHECK_THAT(cluster.worker(first).ReadLog(), !Catch::Contains("registering again"));
}

}  // namespace rlhfd::testing
