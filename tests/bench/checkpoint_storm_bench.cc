// checkpoint_storm_bench: N ranks saving one step's checkpoint at once to one filesystem, as the
// N ranks of a job do at each save (the study this project starts from ran 1,024 GPUs). Each
// rank is a thread; all start together.
//   per-rank: the worker's own SaveRoleState (step_<S>/actor/rank_<r>/ holding state.safetensors
//             and manifest.json, each written to a temporary name, fsynced, renamed, the
//             directory fsynced), then world rank 0's CommitStep (lists every rank's directory
//             and checks its manifest, writes commit.json and `latest`).
//   flat:     the same two files per rank, as large, checked for non-finite values, summed with
//             CRC-32C and written the same atomic way, side by side in one directory
//             (step_<S>/actor/rank_<r>.safetensors, .manifest.json), then one listing of it and
//             the commit record.
// Prints, per layout and rank count, one JSON line and a table row: the storm's wall time (all
// ranks started to all durable), each rank's save p50/p99, the commit's time, and the
// directories and files each layout makes.
//   checkpoint_storm_bench --dir=/path/on/the/filesystem --ranks=256,1024 --shard_bytes=1048576
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/util/crc32c.h"
#include "common/util/files.h"
#include "common/util/program_setup.h"
#include "worker/roles/checkpoint.h"
#include "worker/train/finite_check.h"

ABSL_FLAG(std::string, dir, "/tmp/rlhfd-checkpoint-storm",
          "A directory on the filesystem to measure (emptied of the bench's steps first)");
ABSL_FLAG(std::string, ranks, "1024", "Comma-separated rank counts");
ABSL_FLAG(int64_t, shard_bytes, 1 << 20, "Bytes of training state each rank saves");
ABSL_FLAG(int, repeats, 3, "Storms per layout and rank count (the median is reported)");
ABSL_FLAG(std::string, layouts, "per-rank,flat", "Comma-separated layouts to run");

namespace rlhfd {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Quantile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  return values[static_cast<size_t>(q * static_cast<double>(values.size() - 1))];
}

struct Storm {
  double wall_s = 0;
  double commit_s = 0;
  std::vector<double> rank_s;
  int64_t directories = 0;
  int64_t files = 0;
};

// Runs `save(rank)` on `ranks` threads released together, then `commit()`.
template <typename Save, typename Commit>
Storm RunStorm(int ranks, Save save, Commit commit) {
  Storm storm;
  storm.rank_s.resize(ranks);
  std::barrier start(ranks + 1);
  std::atomic<int> failures = 0;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      start.arrive_and_wait();
      const Clock::time_point begun = Clock::now();
      if (!save(rank)) ++failures;
      storm.rank_s[rank] = Seconds(Clock::now() - begun);
    });
  }
  start.arrive_and_wait();
  const Clock::time_point begun = Clock::now();
  for (std::thread& thread : threads) thread.join();
  storm.wall_s = Seconds(Clock::now() - begun);
  const Clock::time_point committing = Clock::now();
  if (!commit()) ++failures;
  storm.commit_s = Seconds(Clock::now() - committing);
  if (failures > 0) {
    std::fprintf(stderr, "%d saves or the commit failed\n", failures.load());
    std::exit(1);
  }
  return storm;
}

int Main() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const int64_t shard_bytes = absl::GetFlag(FLAGS_shard_bytes);
  if (!MakeDirectories(dir).ok()) {
    std::fprintf(stderr, "cannot make %s\n", dir.c_str());
    return 1;
  }
  // One shard's tensor (float32) and, for the flat layout, bytes of the same size.
  const at::Tensor shard = at::rand({shard_bytes / 4});
  const train::TrainedModel::NamedTensors state = {{"shard", shard}};
  const std::string bytes(static_cast<const char*>(shard.data_ptr()), shard.nbytes());
  std::printf(
      "| layout | ranks | storm wall | rank save p50 | rank save p99 | commit | dirs | "
      "files |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  int64_t step = 0;
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_ranks), ',')) {
    int ranks = 0;
    if (!absl::SimpleAtoi(text, &ranks) || ranks < 1) {
      std::fprintf(stderr, "--ranks: '%s' is not a count\n", std::string(text).c_str());
      return 1;
    }
    const std::vector<std::string> layouts =
        absl::StrSplit(absl::GetFlag(FLAGS_layouts), ',', absl::SkipEmpty());
    for (const std::string& layout : layouts) {
      if (layout != "per-rank" && layout != "flat") {
        std::fprintf(stderr, "--layouts: '%s' is not per-rank or flat\n", layout.c_str());
        return 1;
      }
      std::vector<Storm> storms;
      const roles::CheckpointWriter writer{.job_id = "storm", .attempt = 1};
      for (int repeat = 0; repeat < absl::GetFlag(FLAGS_repeats); ++repeat) {
        ++step;
        const std::string step_dir = roles::StepDirectory(dir, step);
        if (layout == "per-rank") {
          storms.push_back(RunStorm(
              ranks,
              [&](int rank) {
                return roles::SaveRoleState(dir, step, "actor", rank, state, {{"rank", rank}},
                                            writer)
                    .ok();
              },
              [&] { return roles::CommitStep(dir, step, writer).ok(); }));
          storms.back().directories = ranks + 2;
        } else {
          if (!MakeDirectories(step_dir + "/actor").ok()) return 1;
          storms.push_back(RunStorm(
              ranks,
              [&](int rank) {
                if (train::FirstNonFinite({shard})) return false;
                const std::string name = absl::StrCat(step_dir, "/actor/rank_", rank);
                const nlohmann::json manifest = {{"rank", rank}, {"crc32c", Crc32c(bytes)}};
                return WriteFileAtomically(name + ".safetensors", bytes).ok() &&
                       WriteFileAtomically(name + ".manifest.json", manifest.dump()).ok();
              },
              [&] {
                absl::StatusOr<std::vector<std::string>> names = ListDirectory(step_dir + "/actor");
                return names.ok() && names->size() == static_cast<size_t>(2 * ranks) &&
                       WriteFileAtomically(step_dir + "/commit.json", "{}").ok();
              }));
          storms.back().directories = 2;
        }
        storms.back().files = 2 * static_cast<int64_t>(ranks) + 1;
        if (!RemoveTree(step_dir).ok()) return 1;
      }
      std::sort(storms.begin(), storms.end(),
                [](const Storm& a, const Storm& b) { return a.wall_s < b.wall_s; });
      const Storm& median = storms[storms.size() / 2];
      std::vector<double> walls;
      for (const Storm& storm : storms) walls.push_back(storm.wall_s);
      const nlohmann::json line = {{"layout", layout},
                                   {"ranks", ranks},
                                   {"shard_bytes", shard_bytes},
                                   {"storm_wall_s", walls},
                                   {"median_rank_p50_s", Quantile(median.rank_s, 0.5)},
                                   {"median_rank_p99_s", Quantile(median.rank_s, 0.99)},
                                   {"median_commit_s", median.commit_s},
                                   {"directories", median.directories},
                                   {"files", median.files}};
      std::fprintf(stderr, "%s\n", line.dump().c_str());
      std::printf("| %s | %d | %.2f s | %.0f ms | %.0f ms | %.0f ms | %lld | %lld |\n",
                  layout.c_str(), ranks, median.wall_s, 1000 * Quantile(median.rank_s, 0.5),
                  1000 * Quantile(median.rank_s, 0.99), 1000 * median.commit_s,
                  static_cast<long long>(median.directories), static_cast<long long>(median.files));
      std::fflush(stdout);
    }
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
