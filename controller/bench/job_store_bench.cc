// job_store_bench: the job store at scale, against a real rlhfd-controller with no workers (so
// every job stays QUEUED): submit latency through gRPC as the queue grows, the controller's
// resident memory per job beside the store's bytes on disk, a paged walk of ListJobs, and how
// long a restarted controller takes to answer ListJobs. A benchmark, not a test (CTest's
// job_store_scale_test asserts what must hold at this scale); it starts the controller through
// the integration tests' LocalCluster.
//   job_store_bench [--jobs=10000] [--controller=build/controller/rlhfd-controller]
// Prints one JSON line and a table.
#include <grpcpp/client_context.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/util/files.h"
#include "common/util/program_setup.h"
#include "tests/support/cluster_fixture.h"
#include "tests/support/controller_client.h"

ABSL_FLAG(int, jobs, 10000, "Jobs to submit");
ABSL_FLAG(std::string, controller, RLHFD_CONTROLLER_BIN, "The rlhfd-controller to measure");
ABSL_FLAG(std::string, source_dir, RLHFD_SOURCE_DIR,
          "The checkout whose configs/tiny-cpu-demo.yaml (and its fixtures) every job submits");
ABSL_FLAG(int, window, 500, "Submits per latency window (the last one is 'at --jobs queued')");

namespace rlhfd {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration duration) {
  return std::chrono::duration<double, std::milli>(duration).count();
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, static_cast<size_t>(p * values.size()))];
}

// VmRSS of `pid` in KiB (0 if unreadable).
int64_t ResidentKib(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "VmRSS:")) {
      int64_t kib = 0;
      absl::ConsumeSuffix(&rest, "kB");
      return absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kib) ? kib : 0;
    }
  }
  return 0;
}

// Bytes of the job store under `state_dir`: jobs.db and its log, and the jobs/ directory of the
// older file-per-job store (so the bench measures either).
int64_t StoreBytes(const std::string& state_dir) {
  int64_t total = 0;
  const auto size = [](const std::string& path) -> int64_t {
    struct stat st;
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) ? st.st_size : 0;
  };
  for (const char* name : {"jobs.db", "jobs.db-wal", "jobs.db-shm"}) {
    total += size(state_dir + "/" + name);
  }
  if (auto names = ListDirectory(state_dir + "/jobs"); names.ok()) {
    for (const std::string& name : *names) total += size(state_dir + "/jobs/" + name);
  }
  return total;
}

// The controller's trim runs every second; give it two, so the figure is the working size.
int64_t SettledResidentKib(pid_t pid) {
  std::this_thread::sleep_for(std::chrono::seconds(2));
  return ResidentKib(pid);
}

struct Walk {
  bool ok = false;
  int pages = 0;
  int max_page = 0;
  int64_t jobs = 0;
  int64_t duplicates = 0;
  int64_t record_bytes = 0;
  double ms = 0;
};

Walk WalkJobs(const testing::ControllerClient& client) {
  Walk walk;
  std::set<std::string> seen;
  v1::ListJobsRequest request;
  const auto start = Clock::now();
  do {
    grpc::ClientContext context;
    client.Authorize(&context);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::ListJobsReply reply;
    if (!client.jobs->ListJobs(&context, request, &reply).ok()) return walk;
    ++walk.pages;
    walk.max_page = std::max(walk.max_page, reply.jobs_size());
    for (const v1::Job& job : reply.jobs()) {
      if (!seen.insert(job.job_id()).second) ++walk.duplicates;
      walk.record_bytes += static_cast<int64_t>(job.ByteSizeLong());
    }
    request.set_page_token(reply.next_page_token());
  } while (!request.page_token().empty());
  walk.ms = Ms(Clock::now() - start);
  walk.jobs = static_cast<int64_t>(seen.size());
  walk.ok = true;
  return walk;
}

int Main() {
  const int jobs = absl::GetFlag(FLAGS_jobs);
  const int window = std::max(1, absl::GetFlag(FLAGS_window));
  const std::string source = absl::GetFlag(FLAGS_source_dir);
  const absl::StatusOr<std::string> config =
      ReadFileToString(source + "/configs/tiny-cpu-demo.yaml");
  if (!config.ok()) {
    std::cerr << "error: " << config.status().message() << " (set --source_dir)\n";
    return 2;
  }
  testing::LocalCluster cluster({absl::GetFlag(FLAGS_controller), "", ""}, absl::Seconds(2),
                                absl::Seconds(10));
  std::string error;
  if (!cluster.StartController(&error)) {
    std::cerr << "error: " << error << "\n";
    return 1;
  }
  absl::StatusOr<testing::ControllerClient> client = testing::ConnectToController(cluster);
  if (!client.ok()) {
    std::cerr << "error: " << client.status().message() << "\n";
    return 1;
  }
  const int64_t rss_empty_kib = SettledResidentKib(cluster.controller()->pid());

  v1::SubmitJobRequest submit;
  submit.set_config_text(*config);
  submit.set_config_name("tiny-cpu-demo.yaml");
  submit.set_base_dir(source);
  std::vector<double> latencies;
  latencies.reserve(jobs);
  for (int i = 0; i < jobs; ++i) {
    grpc::ClientContext context;
    client->Authorize(&context);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::SubmitJobReply reply;
    const auto start = Clock::now();
    const grpc::Status status = client->jobs->SubmitJob(&context, submit, &reply);
    latencies.push_back(Ms(Clock::now() - start));
    if (!status.ok() || reply.job().state() != v1::JOB_STATE_QUEUED) {
      std::cerr << "error: submit " << i + 1 << ": " << status.error_message() << "\n";
      return 1;
    }
  }
  const pid_t pid = cluster.controller()->pid();
  const int64_t rss_full_kib = SettledResidentKib(pid);
  const int64_t store_bytes = StoreBytes(cluster.state_dir());
  const Walk walk = WalkJobs(*client);

  // A restart: from starting the process to the first ListJobs answered.
  cluster.StopController(SIGTERM);
  const auto restart_start = Clock::now();
  if (!cluster.StartController(&error)) {
    std::cerr << "error: restart: " << error << "\n";
    return 1;
  }
  bool answered = false;
  while (!answered && Clock::now() - restart_start < std::chrono::seconds(60)) {
    grpc::ClientContext context;
    client->Authorize(&context);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    v1::ListJobsRequest first;
    first.set_page_size(1);
    v1::ListJobsReply reply;
    answered = client->jobs->ListJobs(&context, first, &reply).ok() && reply.jobs_size() >= 1;
  }
  const double restart_ms = Ms(Clock::now() - restart_start);
  const int64_t rss_restarted_kib = SettledResidentKib(cluster.controller()->pid());
  const Walk after_restart = WalkJobs(*client);

  std::vector<double> by_window;  // p50 of each window of submits
  for (int begin = 0; begin < jobs; begin += window) {
    by_window.push_back(
        Percentile(std::vector<double>(latencies.begin() + begin,
                                       latencies.begin() + std::min(jobs, begin + window)),
                   0.5));
  }
  const std::vector<double> last(latencies.end() - std::min(jobs, window), latencies.end());
  const auto bytes_per_job = [&](int64_t bytes) { return jobs ? double(bytes) / jobs : 0.0; };
  const nlohmann::json out = {
      {"jobs", jobs},
      {"submit_p50_ms", Percentile(latencies, 0.5)},
      {"submit_p99_ms", Percentile(latencies, 0.99)},
      {"submit_p50_ms_last_window", Percentile(last, 0.5)},
      {"submit_p99_ms_last_window", Percentile(last, 0.99)},
      {"submit_p50_ms_by_window", by_window},
      {"window", window},
      {"rss_empty_kib", rss_empty_kib},
      {"rss_full_kib", rss_full_kib},
      {"rss_restarted_kib", rss_restarted_kib},
      {"rss_bytes_per_job", bytes_per_job((rss_full_kib - rss_empty_kib) * 1024)},
      {"rss_bytes_per_job_restarted", bytes_per_job((rss_restarted_kib - rss_empty_kib) * 1024)},
      {"store_bytes", store_bytes},
      {"store_bytes_per_job", bytes_per_job(store_bytes)},
      {"record_bytes_per_job", bytes_per_job(walk.record_bytes)},
      {"walk_ok", walk.ok},
      {"walk_pages", walk.pages},
      {"walk_max_page", walk.max_page},
      {"walk_jobs", walk.jobs},
      {"walk_duplicates", walk.duplicates},
      {"walk_ms", walk.ms},
      {"restart_to_list_ms", restart_ms},
      {"restart_answered", answered},
      {"walk_after_restart_jobs", after_restart.jobs}};
  std::cout << out.dump() << std::endl;
  std::printf("\n%-38s %12s\n", "measure", "value");
  const auto row = [](const char* name, double value, const char* format = "%12.2f") {
    std::printf("%-38s ", name);
    std::printf(format, value);
    std::printf("\n");
  };
  row("jobs", jobs, "%12.0f");
  row("submit p50 ms (all)", Percentile(latencies, 0.5));
  row("submit p50 ms (last window)", Percentile(last, 0.5));
  row("submit p99 ms (last window)", Percentile(last, 0.99));
  row("RSS empty MiB", rss_empty_kib / 1024.0);
  row("RSS with the jobs MiB", rss_full_kib / 1024.0);
  row("RSS after restart MiB", rss_restarted_kib / 1024.0);
  row("RSS bytes per job", bytes_per_job((rss_full_kib - rss_empty_kib) * 1024), "%12.0f");
  row("RSS bytes per job (restarted)", bytes_per_job((rss_restarted_kib - rss_empty_kib) * 1024),
      "%12.0f");
  row("store bytes per job on disk", bytes_per_job(store_bytes), "%12.0f");
  row("record bytes per job (reply)", bytes_per_job(walk.record_bytes), "%12.0f");
  row("ListJobs walk pages", walk.pages, "%12.0f");
  row("ListJobs walk largest page", walk.max_page, "%12.0f");
  row("ListJobs walk jobs (distinct)", walk.jobs, "%12.0f");
  row("ListJobs walk ms", walk.ms);
  row("restart to ListJobs answered ms", restart_ms);
  const bool ok = walk.ok && walk.jobs == jobs && walk.duplicates == 0 && answered &&
                  after_restart.jobs == jobs;
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace rlhfd

int main(int argc, char** argv) {
  rlhfd::SetUpProgram();
  absl::ParseCommandLine(argc, argv);
  return rlhfd::Main();
}
