// rest_load_bench: N concurrent REST clients (real HTTP, keep-alive) against a controller's
// gateway for a while, each asking in turn for a running job, the job list, the workers, the
// cluster and the job's new steps (metrics?since= the last step it saw, as a dashboard or
// `rlhfctl metrics --follow` follows a run); latency p50/p99/max, errors and requests/s, and the
// job's seconds per step before and during the load (from its metric history), so the load's
// effect on training shows.
//   rest_load_bench --gateway=127.0.0.1:8080 --token_file=STATE/token --job=job-1 \
//       --clients=100 --seconds=30
// Prints one JSON line and a table.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/auth.h"
#include "common/util/program_setup.h"

ABSL_FLAG(std::string, gateway, "127.0.0.1:8080", "host:port of the controller's --http_listen");
ABSL_FLAG(std::string, token_file, "", "The controller's <state_dir>/token");
ABSL_FLAG(std::string, job, "job-1", "A running job the clients ask about");
ABSL_FLAG(int, clients, 100, "Concurrent clients");
ABSL_FLAG(int, seconds, 30, "How long the load lasts");
ABSL_FLAG(int, interval_ms, 0,
          "Each client's pause between requests (0: back to back, saturating the host)");

namespace rlhfd {
namespace {

struct Sample {
  double ms;
  bool ok;
};

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, static_cast<size_t>(p * values.size()))];
}

// Mean seconds per step of the job's steps recorded within [from, to) (Unix ms).
double StepSeconds(const nlohmann::json& history, int64_t from, int64_t to) {
  double sum = 0;
  int count = 0;
  // A step whose fields are not as protobuf's JSON mapping writes them is skipped, not fatal.
  const auto steps = history.find("steps");
  if (steps == history.end() || !steps->is_array()) return 0;
  for (const auto& step : *steps) {
    int64_t time = 0;
    const nlohmann::json::json_pointer time_ms("/time_ms"), seconds_at("/metrics/timing_s~1step");
    if (!step.is_object() || !step.contains(time_ms) || !step[time_ms].is_string() ||
        !step.contains(seconds_at) || !step[seconds_at].is_number() ||
        !absl::SimpleAtoi(step[time_ms].get<std::string>(), &time)) {
      continue;
    }
    const double seconds = step[seconds_at].get<double>();
    if (time < from || time >= to) continue;
    sum += seconds;
    ++count;
  }
  return count ? sum / count : 0;
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int Main() {
  const std::string gateway = absl::GetFlag(FLAGS_gateway);
  const size_t colon = gateway.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(gateway.substr(colon + 1), &port)) {
    std::cerr << "error: --gateway takes host:port\n";
    return 2;
  }
  const std::string host = gateway.substr(0, colon);
  auto token = ResolveClientToken("", absl::GetFlag(FLAGS_token_file));
  if (!token.ok()) {
    std::cerr << "error: " << token.status().message() << "\n";
    return 2;
  }
  const httplib::Headers headers = {{"Authorization", "Bearer " + *token}};
  const std::string job = absl::GetFlag(FLAGS_job);
  const std::vector<std::string> paths = {"/v1/jobs/" + job, "", "/v1/workers", "/v1/cluster",
                                          "/v1/jobs"};  // "": the job's new steps
  // Where the clients start following: ten steps before the job's current one.
  int64_t start_step = 0;
  {
    httplib::Client client(host, port);
    const httplib::Result current = client.Get(("/v1/jobs/" + job).c_str(), headers);
    if (!current || current->status != 200) {
      std::cerr << "error: cannot read " << job << " from the gateway\n";
      return 1;
    }
    const nlohmann::json parsed = nlohmann::json::parse(current->body, nullptr, false);
    int64_t step = 0;
    if (parsed.is_object() &&
        absl::SimpleAtoi(parsed.value(nlohmann::json::json_pointer("/job/progress/current_step"),
                                      std::string("0")),
                         &step)) {
      start_step = std::max<int64_t>(0, step - 10);
    }
  }
  const int clients = absl::GetFlag(FLAGS_clients);
  const auto seconds = std::chrono::seconds(absl::GetFlag(FLAGS_seconds));
  const auto interval = std::chrono::milliseconds(absl::GetFlag(FLAGS_interval_ms));

  const int64_t load_start = NowMs();
  std::mutex mutex;
  std::vector<Sample> samples;
  std::vector<std::thread> threads;
  const auto end = std::chrono::steady_clock::now() + seconds;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      httplib::Client client(host, port);
      client.set_keep_alive(true);
      client.set_tcp_nodelay(true);
      client.set_read_timeout(10, 0);
      std::vector<Sample> mine;
      int64_t seen = start_step;
      for (size_t i = c; std::chrono::steady_clock::now() < end; ++i) {
        const std::string& fixed = paths[i % paths.size()];
        const std::string path =
            fixed.empty() ? absl::StrCat("/v1/jobs/", job, "/metrics?since=", seen) : fixed;
        const auto start = std::chrono::steady_clock::now();
        const httplib::Result result = client.Get(path.c_str(), headers);
        const double ms = std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - start)
                              .count();
        mine.push_back({ms, result && result->status == 200});
        if (interval.count() > 0) std::this_thread::sleep_for(interval);
        if (fixed.empty() && result && result->status == 200) {
          // The newest step in the reply ("step":"N" in protobuf's JSON), without parsing it all.
          const size_t at = result->body.rfind("\"step\":\"");
          int64_t step = 0;
          if (at != std::string::npos) {
            const size_t begin = at + 8, close = result->body.find('"', begin);
            if (absl::SimpleAtoi(result->body.substr(begin, close - begin), &step)) {
              seen = std::max(seen, step);
            }
          }
        }
      }
      std::lock_guard<std::mutex> lock(mutex);
      samples.insert(samples.end(), mine.begin(), mine.end());
    });
  }
  for (std::thread& thread : threads) thread.join();
  const int64_t load_end = NowMs();

  std::vector<double> latencies;
  int64_t errors = 0;
  for (const Sample& sample : samples) {
    latencies.push_back(sample.ms);
    if (!sample.ok) ++errors;
  }
  // The job's pace before the load (the same length of time) and during it.
  httplib::Client client(host, port);
  const httplib::Result history = client.Get(("/v1/jobs/" + job + "/metrics").c_str(), headers);
  double before = 0, during = 0;
  if (history && history->status == 200) {
    const nlohmann::json parsed = nlohmann::json::parse(history->body, nullptr, false);
    if (parsed.is_object()) {
      before = StepSeconds(parsed, load_start - (load_end - load_start), load_start);
      during = StepSeconds(parsed, load_start, load_end);
    }
  }
  const double elapsed = static_cast<double>(load_end - load_start) / 1000.0;
  const nlohmann::json out = {{"clients", clients},
                              {"interval_ms", absl::GetFlag(FLAGS_interval_ms)},
                              {"seconds", elapsed},
                              {"requests", latencies.size()},
                              {"errors", errors},
                              {"requests_per_s", latencies.size() / elapsed},
                              {"p50_ms", Percentile(latencies, 0.5)},
                              {"p99_ms", Percentile(latencies, 0.99)},
                              {"max_ms", Percentile(latencies, 1.0)},
                              {"step_s_before", before},
                              {"step_s_during", during}};
  std::cout << out.dump() << std::endl;
  std::printf("\n%8s %10s %8s %10s %9s %9s %9s %14s %14s\n", "clients", "requests", "errors",
              "req/s", "p50 ms", "p99 ms", "max ms", "step s before", "step s during");
  std::printf("%8d %10zu %8lld %10.0f %9.2f %9.2f %9.2f %14.3f %14.3f\n", clients,
              latencies.size(), static_cast<long long>(errors), latencies.size() / elapsed,
              Percentile(latencies, 0.5), Percentile(latencies, 0.99),
              Percentile(latencies, 1.0), before, during);
  return errors == 0 ? 0 : 1;
}

}  // namespace
}  // namespace rlhfd

int main(int argc, char** argv) {
  rlhfd::SetUpProgram();
  absl::ParseCommandLine(argc, argv);
  return rlhfd::Main();
}
