// sandbox_bench: the code interpreter's throughput, the cost a multi-turn GRPO step pays per tool
// call ([agentic]: 320 calls a step). For each number of concurrent callers (the agent loop's
// tool threads) and each warm-pool size, `calls` calls of `code` spread over the callers, each
// through Sandbox::Run as the tool runs it: the wall time, calls per second, and each call's
// latency (median, 95th percentile, worst). Prints a JSON line per case and a table.
//   sandbox_bench --calls=320 --threads=1,8,16 --warm=2,8,16 [--ballast_mb=8192]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/util/program_setup.h"
#include "worker/agent/sandbox.h"

ABSL_FLAG(int, calls, 320, "Calls per case");
ABSL_FLAG(std::string, threads, "1,8,16", "Concurrent callers, comma-separated");
ABSL_FLAG(std::string, warm, "2,8,16", "Warm-pool sizes (SandboxOptions::warm_processes)");
ABSL_FLAG(std::string, code, "print(2*6)\nprint(12/12)", "The Python each call runs");
ABSL_FLAG(std::string, python, "/usr/bin/python3", "The interpreter (SandboxOptions::python)");
ABSL_FLAG(int, ballast_mb, 0,
          "Memory this process holds (touched) while calling, as a worker holds its model: a "
          "sandbox process cloned from the caller would copy its page tables");

namespace {

std::vector<int> IntList(const std::string& text) {
  std::vector<int> values;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int value = 0;
    if (!absl::SimpleAtoi(part, &value) || value < 1) {
      std::cerr << "sandbox_bench: '" << part << "' is not a positive integer\n";
      std::exit(2);
    }
    values.push_back(value);
  }
  return values;
}

double Percentile(const std::vector<double>& sorted, double share) {
  if (sorted.empty()) return 0;
  const size_t index = std::min(sorted.size() - 1, static_cast<size_t>(share * sorted.size()));
  return sorted[index];
}

}  // namespace

int main(int argc, char** argv) {
  rlhfd::SetUpProgram();
  absl::ParseCommandLine(argc, argv);
  const int calls = absl::GetFlag(FLAGS_calls);
  const std::string code = absl::GetFlag(FLAGS_code);
  std::vector<char> ballast(static_cast<size_t>(absl::GetFlag(FLAGS_ballast_mb)) << 20);
  for (size_t i = 0; i < ballast.size(); i += 4096) ballast[i] = 1;
  std::vector<nlohmann::json> rows;
  for (int warm : IntList(absl::GetFlag(FLAGS_warm))) {
    for (int threads : IntList(absl::GetFlag(FLAGS_threads))) {
      rlhfd::agent::SandboxOptions options;
      options.python = absl::GetFlag(FLAGS_python);
      options.warm_processes = warm;
      auto sandbox = rlhfd::agent::Sandbox::Create(options);
      if (!sandbox.ok()) {
        std::cerr << "sandbox_bench: " << sandbox.status().message() << "\n";
        return 1;
      }
      // The pool fills before the clock starts, as it has between a job's steps.
      std::this_thread::sleep_for(std::chrono::seconds(1));
      std::vector<double> latencies(calls);
      std::atomic<int> next = 0, failed = 0;
      const auto start = std::chrono::steady_clock::now();
      std::vector<std::thread> callers;
      for (int t = 0; t < threads; ++t) {
        callers.emplace_back([&] {
          for (int i = next++; i < calls; i = next++) {
            const auto begin = std::chrono::steady_clock::now();
            const auto result = (*sandbox)->Run(code);
            latencies[i] =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
            if (!result.ok() || result->exit_code != 0) ++failed;
          }
        });
      }
      for (std::thread& caller : callers) caller.join();
      const double wall =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::sort(latencies.begin(), latencies.end());
      nlohmann::json row = {{"calls", calls},
                            {"ballast_mb", absl::GetFlag(FLAGS_ballast_mb)},
                            {"threads", threads},
                            {"warm_processes", warm},
                            {"failed", failed.load()},
                            {"wall_s", wall},
                            {"calls_per_s", calls / wall},
                            {"latency_p50_ms", 1e3 * Percentile(latencies, 0.5)},
                            {"latency_p95_ms", 1e3 * Percentile(latencies, 0.95)},
                            {"latency_max_ms", 1e3 * latencies.back()}};
      std::cout << row.dump() << std::endl;
      rows.push_back(row);
    }
  }
  std::printf("\n%7s %5s %7s %8s %9s %9s %9s %6s\n", "threads", "warm", "wall_s", "calls/s",
              "p50_ms", "p95_ms", "max_ms", "failed");
  for (const nlohmann::json& row : rows) {
    std::printf("%7d %5d %7.2f %8.1f %9.1f %9.1f %9.1f %6d\n", row["threads"].get<int>(),
                row["warm_processes"].get<int>(), row["wall_s"].get<double>(),
                row["calls_per_s"].get<double>(), row["latency_p50_ms"].get<double>(),
                row["latency_p95_ms"].get<double>(), row["latency_max_ms"].get<double>(),
                row["failed"].get<int>());
  }
  return 0;
}
