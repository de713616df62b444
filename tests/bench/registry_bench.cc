// registry_bench: a real rlhfd-controller process and N simulated workers registering with it and
// heartbeating, each through the worker's own ControllerLink (its thread, its backoff, its
// heartbeat RPC), spread over K child processes of this binary (N/K links each, one channel per
// process). Measured: the registration of all N (from the links' start until the controller's
// GetCluster counts N alive), then the controller's CPU share (user + system time from
// /proc/PID/stat over a window, per core) while the N heartbeat at its interval and nothing else
// happens; the controller's resident memory.
//   registry_bench --controller_bin=build/controller/rlhfd-controller --workers=1024,4096
// Prints one JSON line per worker count and a table.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/rpc/auth.h"
#include "common/rpc/grpc_options.h"
#include "common/status/status_macros.h"
#include "common/util/program_setup.h"
#include "rlhfd/v1/cluster_service.grpc.pb.h"
#include "tests/bench/child_processes.h"
#include "worker/service/controller_link.h"

ABSL_FLAG(std::string, controller_bin, "build/controller/rlhfd-controller",
          "The controller binary to start");
ABSL_FLAG(std::string, workers, "1024", "Comma-separated simulated worker counts");
ABSL_FLAG(int, processes, 8, "Child processes the simulated workers are spread over");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(2),
          "The controller's --heartbeat_interval (its default)");
ABSL_FLAG(absl::Duration, window, absl::Seconds(20), "How long the heartbeat CPU is measured");
ABSL_FLAG(int, serve_first, -1, "Internal: the first simulated worker index of this child");
ABSL_FLAG(int, serve_count, 0, "Internal: how many links this child runs");
ABSL_FLAG(std::string, serve_controller, "", "Internal: the controller's address");
ABSL_FLAG(std::string, serve_token, "", "Internal: the admin token (the links register with it)");

namespace rlhfd {
namespace {

// A child: `serve_count` links until stdin (a pipe from the parent) closes.
int Serve() {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      MakeChannel(absl::GetFlag(FLAGS_serve_controller), RpcOptions{});
  if (!channel.ok()) return 1;
  std::shared_ptr<v1::WorkerRegistry::StubInterface> stub = v1::WorkerRegistry::NewStub(*channel);
  std::vector<std::unique_ptr<worker::ControllerLink>> links;
  const int first = absl::GetFlag(FLAGS_serve_first);
  for (int i = 0; i < absl::GetFlag(FLAGS_serve_count); ++i) {
    v1::WorkerCapacity capacity;
    capacity.set_host(absl::StrCat("sim-", first + i));
    capacity.set_device_kind(v1::DEVICE_KIND_CPU);
    capacity.set_device_index(-1);
    capacity.set_device_name("simulated");
    capacity.set_memory_total_bytes(int64_t{64} << 30);
    worker::ControllerLinkOptions options;
    options.token = absl::GetFlag(FLAGS_serve_token);
    links.push_back(std::make_unique<worker::ControllerLink>(stub, options, capacity));
    // A port nothing listens on: the controller is never asked to call these workers.
    links.back()->Start(absl::StrCat("sim-", first + i), absl::StrCat("127.0.0.1:", 9 + i % 2));
  }
  bench::WaitForStdinToClose();
  for (auto& link : links) link->Stop();
  return 0;
}

double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
  const std::vector<std::string> fields =
      absl::StrSplit(text.substr(text.rfind(')') + 2), ' ', absl::SkipEmpty());
  double utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtod(fields[11], &utime) ||
      !absl::SimpleAtod(fields[12], &stime)) {
    return 0;
  }
  return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double ResidentMiB(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024;
  }
  return 0;
}

struct Result {
  int workers = 0;
  double registration_s = 0, cpu_share = 0, rss_mib = 0, heartbeats_per_s = 0;
};

absl::StatusOr<Result> Run(int workers, const std::string& dir) {
  const std::string state = absl::StrCat(dir, "/state-", workers);
  const std::string port_file = state + ".port";
  bench::ChildProcesses controller_process;
  ASSIGN_OR_RETURN(
      const pid_t controller,
      controller_process.Start(
          absl::GetFlag(FLAGS_controller_bin),
          {"--state_dir=" + state, "--listen=127.0.0.1:0", "--port_file=" + port_file,
           "--heartbeat_interval=" + absl::FormatDuration(absl::GetFlag(FLAGS_heartbeat_interval)),
           "--liveness_window=" +
               absl::FormatDuration(absl::GetFlag(FLAGS_heartbeat_interval) * 5)},
          dir + "/controller.log"));
  std::string address;
  for (int waited = 0; address.empty() && waited < 400; ++waited) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream in(port_file);
    int port = 0;
    if (in >> port && port > 0) address = absl::StrCat("127.0.0.1:", port);
  }
  std::ifstream token_in(state + "/token");
  std::string token;
  std::getline(token_in, token);
  if (address.empty() || token.empty()) return absl::InternalError("the controller did not start");

  const auto start = std::chrono::steady_clock::now();
  bench::ChildProcesses links;
  const int processes = absl::GetFlag(FLAGS_processes);
  for (int k = 0, first = 0; k < processes; ++k) {
    const int count = workers / processes + (k < workers % processes ? 1 : 0);
    RETURN_IF_ERROR(
        links
            .Start("/proc/self/exe",
                   {absl::StrCat("--serve_first=", first), absl::StrCat("--serve_count=", count),
                    "--serve_controller=" + address, "--serve_token=" + token},
                   dir + "/children.log")
            .status());
    first += count;
  }
  // GetCluster until all are alive.
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(address, RpcOptions{});
  if (!channel.ok()) return channel.status();
  auto cluster = v1::ClusterService::NewStub(*channel);
  const auto alive = [&] {
    v1::GetClusterRequest request;
    v1::GetClusterReply reply;
    grpc::ClientContext context;
    AttachToken(&context, token);
    if (!cluster->GetCluster(&context, request, &reply).ok()) return -1;
    return reply.workers_alive();
  };
  Result result;
  result.workers = workers;
  while (alive() < workers) {
    if (std::chrono::steady_clock::now() - start > std::chrono::minutes(5)) {
      return absl::DeadlineExceededError("the workers did not all register in 5 minutes");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  result.registration_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Heartbeats only: one interval to settle, then the window.
  std::this_thread::sleep_for(absl::ToChronoNanoseconds(absl::GetFlag(FLAGS_heartbeat_interval)));
  const double cpu_before = ProcessCpuSeconds(controller);
  const auto window_start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(absl::ToChronoNanoseconds(absl::GetFlag(FLAGS_window)));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - window_start).count();
  result.cpu_share = (ProcessCpuSeconds(controller) - cpu_before) / seconds;
  result.rss_mib = ResidentMiB(controller);
  result.heartbeats_per_s =
      workers / absl::ToDoubleSeconds(absl::GetFlag(FLAGS_heartbeat_interval));
  const int still_alive = alive();
  links.CloseStdinsAndWait();
  if (still_alive != workers) {
    return absl::InternalError(
        absl::StrCat(workers - still_alive, " workers were lost during the window"));
  }
  return result;
}

int Main() {
  if (absl::GetFlag(FLAGS_serve_first) >= 0) return Serve();
  char dir_template[] = "/tmp/registry-bench-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) return 1;
  const std::string dir = dir_template;
  std::vector<Result> results;
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_workers), ',')) {
    int workers = 0;
    if (!absl::SimpleAtoi(item, &workers) || workers < 1) {
      std::cerr << "error: --workers takes counts, e.g. 1024,4096\n";
      return 2;
    }
    absl::StatusOr<Result> result = Run(workers, dir);
    if (!result.ok()) {
      std::cerr << "error: " << result.status().message() << " (logs in " << dir << ")\n";
      return 1;
    }
    std::cout << nlohmann::json{{"workers", result->workers},
                                {"processes", absl::GetFlag(FLAGS_processes)},
                                {"registration_s", result->registration_s},
                                {"heartbeats_per_s", result->heartbeats_per_s},
                                {"controller_cpu_share", result->cpu_share},
                                {"controller_rss_mib", result->rss_mib}}
                     .dump()
              << std::endl;
    results.push_back(*result);
  }
  std::error_code error;
  std::filesystem::remove_all(dir, error);
  std::printf("\n%8s %16s %14s %20s %18s\n", "workers", "registration s", "heartbeats/s",
              "controller CPU share", "controller RSS MiB");
  for (const Result& r : results) {
    std::printf("%8d %16.2f %14.0f %19.1f%% %18.1f\n", r.workers, r.registration_s,
                r.heartbeats_per_s, r.cpu_share * 100, r.rss_mib);
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
