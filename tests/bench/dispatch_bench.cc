// dispatch_bench: the driver's stage dispatch over many simulated workers. Each simulated worker
// is a real gRPC server (the worker's own WorkerService adapter, token checked) in this process
// whose stages answer at once with empty replies; the driver's JobStages runs PPO steps over
// gRPC stage clients to them, split over actor (1/2 of the workers), critic (1/4), reference and
// reward model (1/8 each). What is measured is the control plane alone: each stage call's round
// trip, each stage's fan-out to its pool (issue to last reply), and steps per second.
// With --worker_processes=K the simulated workers are K child processes of this one (the same
// binary, serving N/K each), so this process holds only the driver and its clients: its own CPU
// time per step and per call (getrusage) is the controller's dispatch cost, apart from the
// workers'. Without it (0) everything shares this process and its CPU time counts the servers.
// With --stage_ms the simulated workers take that long over the named stages (a Forward by its
// kind), as a job's real stages would: comparing the step time at N workers with that at 8 (where
// dispatch costs next to nothing) gives what the control plane adds to a step of that shape.
//   dispatch_bench --workers=64,256 --steps=200 --warmup=20
//   dispatch_bench --workers=256,1024 --worker_processes=4 --steps=60 --warmup=5
//   dispatch_bench --workers=8,1024 --worker_processes=4 --steps=5 --warmup=1
//       --stage_ms=Generate=3000,UpdateActor=2000,Forward/REF_LOG_PROBS=500   (one line)
// Prints one JSON line per worker count and a table.
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/grpc_options.h"
#include "common/status/status_macros.h"
#include "common/util/program_setup.h"
#include "controller/driver/job_stages.h"
#include "tests/bench/child_processes.h"
#include "tests/bench/simulated_job.h"
#include "worker/service/worker_service.h"

ABSL_FLAG(std::string, workers, "64,256", "Comma-separated simulated worker counts");
ABSL_FLAG(int, steps, 200, "Timed PPO steps per worker count");
ABSL_FLAG(int, warmup, 20, "Untimed steps first");
ABSL_FLAG(int, prompts_per_actor, 4, "Prompts per actor rank per step (request payload)");
ABSL_FLAG(int, worker_processes, 0,
          "Child processes holding the simulated workers (0: this process holds them)");
ABSL_FLAG(int, serve_workers, 0, "Internal: serve this many simulated workers and wait");
ABSL_FLAG(std::string, stage_ms, "",
          "Simulated stage durations, e.g. Generate=3000,UpdateActor=2000,Forward/VALUES=500 "
          "(a Forward by its kind: OLD_LOG_PROBS, REF_LOG_PROBS, VALUES, REWARD_SCORES); others "
          "answer at once");
ABSL_FLAG(int, relay_above, 0,
          "Fan-outs to more ranks than this go through relaying workers (the controller's "
          "--stage_relay_above; 0: the driver calls every rank)");
ABSL_FLAG(int, relay_group, 0, "Ranks a relay calls at most (0: the square root of a fan-out's)");
ABSL_FLAG(std::string, serve_port_file, "", "Internal: where a child writes its ports");

namespace rlhfd {
namespace {

constexpr char kToken[] = "dispatch-bench-token";

// How long each simulated stage takes, by stage name ("Generate", "Forward/VALUES"); --stage_ms
// parsed. Stages not named take no time.
using StageDurations = std::map<std::string, absl::Duration>;

#define RLHFD_STAGE_NAME(Name, Request, Reply) #Name,
const absl::flat_hash_set<std::string> kStageNames = {RLHFD_STAGES(RLHFD_STAGE_NAME)};
#undef RLHFD_STAGE_NAME

absl::StatusOr<StageDurations> ParseStageDurations(absl::string_view text) {
  StageDurations durations;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> parts = absl::StrSplit(item, absl::MaxSplits('=', 1));
    int ms = 0;
    if (!absl::SimpleAtoi(parts.second, &ms) || ms < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stage_ms: '", item, "' is not NAME=MILLISECONDS"));
    }
    std::string name = parts.first;
    v1::ForwardKind kind = v1::FORWARD_KIND_UNSPECIFIED;
    if (absl::StartsWith(name, "Forward/")) {
      name = "Forward/FORWARD_KIND_" + name.substr(8);
      if (!v1::ForwardKind_Parse(name.substr(8), &kind) || kind == v1::FORWARD_KIND_UNSPECIFIED) {
        return absl::InvalidArgumentError(absl::StrCat("--stage_ms: no Forward kind '", item, "'"));
      }
    } else if (!kStageNames.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat("--stage_ms: no stage named '", name, "'"));
    }
    durations[name] = absl::Milliseconds(ms);
  }
  return durations;
}

// Runs callbacks at their due times on a thread of its own, so a simulated stage can take time
// without holding a gRPC thread.
class DueCallbacks {
 public:
  DueCallbacks() : thread_([this] { Run(); }) {}
  ~DueCallbacks() {
    {
      absl::MutexLock lock(&mutex_);
      stopping_ = true;
    }
    thread_.join();
  }
  void At(absl::Time due, std::function<void()> callback) {
    absl::MutexLock lock(&mutex_);
    due_.emplace(due, std::move(callback));
  }

 private:
  void Run() {
    absl::MutexLock lock(&mutex_);
    while (!stopping_) {
      const absl::Time wake =
          due_.empty() ? absl::Now() + absl::Milliseconds(50) : due_.begin()->first;
      mutex_.AwaitWithDeadline(absl::Condition(
                                   +[](bool* stopping) { return *stopping; }, &stopping_),
                               wake);
      while (!due_.empty() && due_.begin()->first <= absl::Now()) {
        std::function<void()> callback = std::move(due_.begin()->second);
        due_.erase(due_.begin());
        mutex_.Unlock();
        callback();
        mutex_.Lock();
      }
    }
  }

  absl::Mutex mutex_;
  std::multimap<absl::Time, std::function<void()>> due_ ABSL_GUARDED_BY(mutex_);
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

// A worker's stages answering with empty replies: at once, or after the stage's duration.
class SimulatedStages final : public stages::StageService {
 public:
  explicit SimulatedStages(StageDurations durations) : durations_(std::move(durations)) {}
  const StageDurations& durations() const { return durations_; }

#define RLHFD_SIMULATED_STAGE(Name, Request, Reply)                                        \
  void Name(const v1::Request& request, absl::Duration, stages::StageDone<v1::Reply> done) \
      override {                                                                           \
    Answer(StageName(#Name, request), [done = std::move(done)] { done(v1::Reply()); });    \
  }
  RLHFD_STAGES(RLHFD_SIMULATED_STAGE)
#undef RLHFD_SIMULATED_STAGE

 private:
  template <typename Request>
  static std::string StageName(const char* name, const Request& request) {
    if constexpr (std::is_same_v<Request, v1::ForwardRequest>) {
      return absl::StrCat(name, "/", v1::ForwardKind_Name(request.kind()));
    }
    return name;
  }
  void Answer(const std::string& stage, std::function<void()> answer) {
    const auto it = durations_.find(stage);
    if (it == durations_.end() || it->second <= absl::ZeroDuration()) return answer();
    due_.At(absl::Now() + it->second, std::move(answer));
  }

  StageDurations durations_;
  DueCallbacks due_;
};

// The stage client of one rank, recording each call's round trip.
class TimedStages final : public stages::StageService {
 public:
  TimedStages(std::unique_ptr<stages::StageService> inner, std::mutex& mutex,
              std::vector<double>& samples_ms)
      : inner_(std::move(inner)), mutex_(mutex), samples_ms_(samples_ms) {}

#define RLHFD_TIMED_STAGE(Name, Request, Reply)                                           \
  void Name(const v1::Request& request, absl::Duration deadline,                          \
            stages::StageDone<v1::Reply> done) override {                                 \
    const auto start = std::chrono::steady_clock::now();                                  \
    inner_->Name(request, deadline,                                                       \
                 [this, start, done = std::move(done)](absl::StatusOr<v1::Reply> reply) { \
                   Record(start);                                                         \
                   done(std::move(reply));                                                \
                 });                                                                      \
  }
  RLHFD_STAGES(RLHFD_TIMED_STAGE)
  RLHFD_TIMED_STAGE(Relay, RelayRequest, RelayReply)
#undef RLHFD_TIMED_STAGE

 private:
  void Record(std::chrono::steady_clock::time_point start) {
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard<std::mutex> lock(mutex_);
    samples_ms_.push_back(ms);
  }

  std::unique_ptr<stages::StageService> inner_;
  std::mutex& mutex_;
  std::vector<double>& samples_ms_;
};

// Simulated workers: `count` servers of `stages` on loopback ports; their ports. The servers
// and services are kept in `servers` and `services`.
absl::StatusOr<std::vector<int>> StartServers(
    int count, stages::StageService& stages, worker::StageRelay& relay,
    std::vector<std::unique_ptr<worker::WorkerServiceImpl>>& services,
    std::vector<std::unique_ptr<grpc::Server>>& servers) {
  std::vector<int> ports(count);
  for (int i = 0; i < count; ++i) {
    services.push_back(std::make_unique<worker::WorkerServiceImpl>(
        nullptr, &stages, &relay, [] { return worker::HostedStatus{}; },
        [] { return std::string(kToken); }, 0));
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &ports[i]);
    builder.RegisterService(services.back().get());
    servers.push_back(builder.BuildAndStart());
    if (!servers.back() || ports[i] == 0) {
      return absl::InternalError(absl::StrCat("simulated worker ", i, " did not start"));
    }
  }
  return ports;
}

// A child: serves --serve_workers workers, writes their ports, and lives until its stdin (a pipe
// from the parent) closes.
int Serve() {
  absl::StatusOr<StageDurations> durations = ParseStageDurations(absl::GetFlag(FLAGS_stage_ms));
  if (!durations.ok()) {
    std::cerr << "error: " << durations.status().message() << "\n";
    return 2;
  }
  SimulatedStages stages(*std::move(durations));
  worker::StageRelay relay(RpcOptions{});
  std::vector<std::unique_ptr<worker::WorkerServiceImpl>> services;
  std::vector<std::unique_ptr<grpc::Server>> servers;
  absl::StatusOr<std::vector<int>> ports =
      StartServers(absl::GetFlag(FLAGS_serve_workers), stages, relay, services, servers);
  if (!ports.ok()) {
    std::cerr << "error: " << ports.status().message() << "\n";
    return 1;
  }
  const std::string path = absl::GetFlag(FLAGS_serve_port_file);
  {
    std::ofstream out(path + ".tmp");
    for (int port : *ports) out << port << "\n";
  }
  std::filesystem::rename(path + ".tmp", path);
  bench::WaitForStdinToClose();
  for (auto& server : servers) server->Shutdown(std::chrono::system_clock::now());
  return 0;
}

// The children serving `workers` simulated workers in `processes` processes, and their ports.
absl::StatusOr<std::vector<int>> StartWorkerProcesses(int workers, int processes,
                                                      const std::string& dir,
                                                      bench::ChildProcesses& children) {
  std::vector<std::string> files;
  for (int k = 0; k < processes; ++k) {
    const int count = workers / processes + (k < workers % processes ? 1 : 0);
    files.push_back(absl::StrCat(dir, "/ports.", k));
    RETURN_IF_ERROR(children
                        .Start("/proc/self/exe", {absl::StrCat("--serve_workers=", count),
                                                  "--serve_port_file=" + files.back(),
                                                  "--stage_ms=" + absl::GetFlag(FLAGS_stage_ms)})
                        .status());
  }
  std::vector<int> ports;
  for (const std::string& file : files) {
    for (int waited = 0; !std::filesystem::exists(file); ++waited) {
      if (waited > 1200) return absl::DeadlineExceededError("a worker process did not start");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::ifstream in(file);
    for (int port; in >> port;) ports.push_back(port);
  }
  return ports;
}

double CpuSeconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t index = std::min(values.size() - 1, static_cast<size_t>(p * values.size()));
  return values[index];
}

struct Result {
  int workers = 0;
  double call_p50 = 0, call_p99 = 0, stage_p50 = 0, stage_p99 = 0, stage_max = 0;
  double steps_per_s = 0, step_s = 0;
  int64_t calls = 0, stages = 0;
  int worker_processes = 0;
  double cpu_ms_per_step = 0, cpu_us_per_call = 0, cpu_share = 0;  // this process's
};

absl::StatusOr<Result> Run(int workers, int steps, int warmup, int prompts_per_actor,
                           int worker_processes) {
  // The simulated workers: one server each, on a port of its own, here or in child processes.
  ASSIGN_OR_RETURN(StageDurations durations, ParseStageDurations(absl::GetFlag(FLAGS_stage_ms)));
  SimulatedStages stages(std::move(durations));
  worker::StageRelay relay(RpcOptions{});
  std::vector<std::unique_ptr<worker::WorkerServiceImpl>> services;
  std::vector<std::unique_ptr<grpc::Server>> servers;
  bench::ChildProcesses children;
  std::vector<int> ports;
  if (worker_processes > 0) {
    char dir_template[] = "/tmp/dispatch-bench-XXXXXX";
    if (::mkdtemp(dir_template) == nullptr) return absl::InternalError("mkdtemp failed");
    absl::StatusOr<std::vector<int>> started =
        StartWorkerProcesses(workers, worker_processes, dir_template, children);
    std::error_code error;
    std::filesystem::remove_all(dir_template, error);
    if (!started.ok()) return started.status();
    ports = *std::move(started);
  } else {
    ASSIGN_OR_RETURN(ports, StartServers(workers, stages, relay, services, servers));
  }
  std::mutex mutex;
  std::vector<double> calls_ms;
  std::vector<std::unique_ptr<stages::StageService>> clients;
  std::vector<stages::StageService*> ranks;
  std::vector<std::string> addresses;
  for (int i = 0; i < workers; ++i) {
    addresses.push_back(absl::StrCat("127.0.0.1:", ports[i]));
    ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                     MakeChannel(addresses.back(), RpcOptions{}));
    clients.push_back(std::make_unique<TimedStages>(
        stages::MakeGrpcStageService(std::move(channel), kToken), mutex, calls_ms));
    ranks.push_back(clients.back().get());
  }
  const v1::JobSpec spec = bench::SimulatedPpoJob("dispatch-bench", workers);
  absl::Duration longest_stage;
  for (const auto& [name, duration] : stages.durations())
    longest_stage = std::max(longest_stage, duration);
  controller::JobStages job("job-bench", spec, ranks,
                            {.stage_deadline = absl::Seconds(10) + longest_stage,
                             .relay_above = absl::GetFlag(FLAGS_relay_above),
                             .relay_group = absl::GetFlag(FLAGS_relay_group),
                             .rank_addresses = addresses});
  RETURN_IF_ERROR(job.Start(steps + warmup));
  const int64_t actors = spec.roles().actor().gpus();
  std::vector<double> stages_ms;
  double timed_seconds = 0, cpu_before = 0;
  for (int step = 1; step <= warmup + steps; ++step) {
    controller::StepPlan plan{.step = step, .seed = static_cast<uint64_t>(step)};
    for (int64_t p = 0; p < actors * prompts_per_actor; ++p) {
      v1::PromptRow row;
      row.set_text(absl::StrCat("What is ", p, " + ", step, "? Answer with the number."));
      row.set_ground_truth_json(absl::StrCat("\"", p + step, "\""));
      plan.prompts.push_back(std::move(row));
    }
    if (step == warmup + 1) {
      std::lock_guard<std::mutex> lock(mutex);
      calls_ms.clear();
      cpu_before = CpuSeconds();
    }
    ASSIGN_OR_RETURN(const controller::Metrics metrics, job.RunStep(plan));
    if (step <= warmup) continue;
    timed_seconds += metrics.at("timing_s/step");
    for (const auto& [name, value] : metrics) {
      if (name.rfind("timing_s/", 0) == 0 && name != "timing_s/step") {
        stages_ms.push_back(value * 1000);
      }
    }
  }
  const double cpu_seconds = CpuSeconds() - cpu_before;
  job.End();
  Result result;
  result.workers = workers;
  result.worker_processes = worker_processes;
  result.cpu_ms_per_step = cpu_seconds * 1000 / steps;
  result.cpu_share = cpu_seconds / std::max(timed_seconds, 1e-9);
  {
    std::lock_guard<std::mutex> lock(mutex);
    result.call_p50 = Percentile(calls_ms, 0.50);
    result.call_p99 = Percentile(calls_ms, 0.99);
    result.calls = static_cast<int64_t>(calls_ms.size());
  }
  result.cpu_us_per_call = cpu_seconds * 1e6 / std::max<int64_t>(1, result.calls);
  result.stage_p50 = Percentile(stages_ms, 0.50);
  result.stage_p99 = Percentile(stages_ms, 0.99);
  result.stage_max = Percentile(stages_ms, 1.0);
  result.stages = static_cast<int64_t>(stages_ms.size());
  result.steps_per_s = steps / std::max(timed_seconds, 1e-9);
  result.step_s = timed_seconds / steps;
  clients.clear();
  for (auto& server : servers) server->Shutdown(std::chrono::system_clock::now());
  return result;
}

int Main() {
  if (absl::GetFlag(FLAGS_serve_workers) > 0) return Serve();
  std::vector<Result> results;
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_workers), ',')) {
    int workers = 0;
    if (!absl::SimpleAtoi(item, &workers) || workers < 8) {
      std::cerr << "error: --workers takes counts of at least 8, e.g. 64,256\n";
      return 2;
    }
    absl::StatusOr<Result> result =
        Run(workers, absl::GetFlag(FLAGS_steps), absl::GetFlag(FLAGS_warmup),
            absl::GetFlag(FLAGS_prompts_per_actor), absl::GetFlag(FLAGS_worker_processes));
    if (!result.ok()) {
      std::cerr << "error: " << result.status().message() << "\n";
      return 1;
    }
    std::cout << nlohmann::json{{"workers", result->workers},
                                {"steps", absl::GetFlag(FLAGS_steps)},
                                {"calls", result->calls},
                                {"call_p50_ms", result->call_p50},
                                {"call_p99_ms", result->call_p99},
                                {"stages", result->stages},
                                {"stage_p50_ms", result->stage_p50},
                                {"stage_p99_ms", result->stage_p99},
                                {"stage_max_ms", result->stage_max},
                                {"steps_per_s", result->steps_per_s},
                                {"step_s", result->step_s},
                                {"stage_ms", absl::GetFlag(FLAGS_stage_ms)},
                                {"worker_processes", result->worker_processes},
                                {"cpu_ms_per_step", result->cpu_ms_per_step},
                                {"cpu_us_per_call", result->cpu_us_per_call},
                                {"cpu_share", result->cpu_share}}
                     .dump()
              << std::endl;
    results.push_back(*result);
  }
  // CPU: this process's (with worker processes, the driver's alone).
  std::printf("\n%8s %12s %12s %13s %13s %12s %10s %10s %12s %12s\n", "workers", "call p50 ms",
              "call p99 ms", "stage p50 ms", "stage p99 ms", "stage max ms", "steps/s", "step s",
              "cpu ms/step", "cpu us/call");
  for (const Result& r : results) {
    std::printf("%8d %12.3f %12.3f %13.3f %13.3f %12.3f %10.1f %10.3f %12.2f %12.1f\n", r.workers,
                r.call_p50, r.call_p99, r.stage_p50, r.stage_p99, r.stage_max, r.steps_per_s,
                r.step_s, r.cpu_ms_per_step, r.cpu_us_per_call);
  }
  return 0;
}

}  // namespace
}  // namespace rlhfd

int main(int argc, char** argv) {
  rlhfd::SetUpProgram();
  absl::ParseCommandLine(argc, argv);
  return rlhfd::Main();
}
