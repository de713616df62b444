// reshard_bench: time to reshard actor weights of a preset shape from the training layout
// (dp = ranks, flat ZeRO shards) to rollout layouts (tp_g = ranks, and tp_g = 1), over NCCL, one
// process per GPU, layer by layer; beside the bound measured in the same run: the bytes that must
// reach each rank over the GPU link, over the all-gather bandwidth the link gives. Also the extra
// GPU memory the reshard takes, against one rollout shard plus one bucket. Prints JSON and a table.
//   reshard_bench --preset=qwen2.5-7b --ranks=2      (starts one process per GPU itself)
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <spawn.h>
#include <sys/wait.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "worker/bench/model_presets.h"
#include "worker/parallel/nccl_communicator.h"
#include "worker/parallel/reshard.h"
#include "worker/parallel/socket_communicator.h"
#include "worker/parallel/tensor_parallel.h"

ABSL_FLAG(std::string, preset, "qwen2.5-0.5b", "qwen2.5-0.5b, qwen2.5-1.5b or qwen2.5-7b");
ABSL_FLAG(int, ranks, 2, "GPUs (processes)");
ABSL_FLAG(int, rank, -1, "Internal: this process's rank (-1 starts all of them)");
ABSL_FLAG(std::string, master, "127.0.0.1:29711", "Rendezvous address");
ABSL_FLAG(int, repeat, 3, "Timed reshards per layout; the best is reported");

namespace {

using Clock = std::chrono::steady_clock;
using rlhfd::parallel::Communicator;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

int64_t Allocated() {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device())
      .allocated_bytes[0]
      .current;
}

int64_t Peak() {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device())
      .allocated_bytes[0]
      .peak;
}

// Maximum of a value over the ranks (through the bootstrap sockets).
double MaxOver(Communicator& sockets, double value) {
  at::Tensor t = at::full({1}, value, at::kDouble);
  (void)sockets.AllReduce(t, rlhfd::parallel::ReduceOp::kMax);
  return t.item<double>();
}

int RunRank(int rank, int ranks) {
  auto config = rlhfd::bench::PresetConfig(absl::GetFlag(FLAGS_preset));
  if (!config.ok()) {
    std::cerr << config.status().message() << "\n";
    return 2;
  }
  rlhfd::parallel::SocketOptions socket_options;
  socket_options.master = absl::GetFlag(FLAGS_master);
  auto sockets = rlhfd::parallel::CreateSocketCommunicator(rank, ranks, socket_options);
  if (!sockets.ok()) {
    std::cerr << sockets.status() << "\n";
    return 1;
  }
  const at::Device device(at::kCUDA, rank);
  c10::cuda::set_device(rank);
  at::Tensor id = at::zeros({128}, at::kByte);
  if (rank == 0) {
    auto unique = rlhfd::parallel::NewNcclUniqueId();
    if (!unique.ok()) return 1;
    std::memcpy(id.data_ptr(), unique->data(), unique->size());
  }
  if (!(*sockets)->Broadcast(id, 0).ok()) return 1;
  auto nccl = rlhfd::parallel::CreateNcclCommunicator(
      rank, ranks, std::string(static_cast<const char*>(id.data_ptr()), 128), device, {});
  if (!nccl.ok()) {
    std::cerr << nccl.status() << "\n";
    return 1;
  }
  Communicator& world = **nccl;
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16).device(device);

  // The link's all-gather bandwidth: each rank receives (ranks - 1) GiB-sized pieces.
  const int64_t piece = int64_t{1} << 29;  // 512 Mi bf16 elements = 1 GiB
  {
    at::Tensor input = at::ones({piece}, bf16), output = at::empty({piece * ranks}, bf16);
    (void)world.AllGather(input, output);
    const auto start = Clock::now();
    for (int i = 0; i < 5; ++i) (void)world.AllGather(input, output);
    const double seconds = Seconds(start) / 5;
    const double received_per_s = 2.0 * piece * (ranks - 1) / seconds;
    const double bandwidth = MaxOver(**sockets, -received_per_s) * -1;  // The slowest rank.
    nlohmann::json buckets_json;
    // Training shards (dp = ranks, tp = 1), random values, bucketed by layer.
    const rlhfd::parallel::TrainLayout train{ranks, 1};
    std::map<std::string, std::vector<rlhfd::parallel::ShardedParameter>> buckets;
    for (const auto& spec : rlhfd::parallel::TensorParallelSpecs(*config)) {
      const std::string prefix = "model.layers.";
      std::string bucket = "root:" + spec.name;  // Embeddings and heads: a bucket each.
      if (spec.name.rfind(prefix, 0) == 0) bucket = spec.name.substr(0, spec.name.find('.', prefix.size()));
      if (spec.name == "model.norm.weight") bucket = "root:norm";
      buckets[bucket].push_back(spec);
    }
    std::map<std::string, std::vector<at::Tensor>> shards;
    int64_t largest_bucket = 0;
    for (const auto& [name, specs] : buckets) {
      int64_t bucket_bytes = 0;
      for (const auto& spec : specs) {
        shards[name].push_back(at::randn({rlhfd::parallel::TrainShardNumel(spec, train)}, bf16));
        int64_t numel = 1;
        for (int64_t d : spec.shape) numel *= d;
        bucket_bytes += numel * 2;
      }
      largest_bucket = std::max(largest_bucket, bucket_bytes);
    }
    c10::cuda::device_synchronize();
    for (const rlhfd::parallel::RolloutLayout rollout :
         {rlhfd::parallel::RolloutLayout{ranks, 1}, rlhfd::parallel::RolloutLayout{1, ranks}}) {
      double best = 1e30, extra = 0;
      int64_t received = 0, rollout_bytes = 0;
      for (int r = 0; r <= absl::GetFlag(FLAGS_repeat); ++r) {  // r = 0: warm-up
        std::vector<at::Tensor> rollout_copy;
        c10::cuda::device_synchronize();
        c10::cuda::CUDACachingAllocator::resetPeakStats(rank);
        const int64_t base = Allocated();
        const auto start = Clock::now();
        received = 0;
        for (const auto& [name, specs] : buckets) {
          rlhfd::parallel::ReshardStats stats;
          auto slices = rlhfd::parallel::Reshard(world, specs, shards[name], train, rollout, &stats);
          if (!slices.ok()) {
            std::cerr << slices.status() << "\n";
            return 1;
          }
          received += stats.received;
          for (at::Tensor& slice : *slices) rollout_copy.push_back(std::move(slice));
        }
        c10::cuda::device_synchronize();
        const double seconds = MaxOver(**sockets, Seconds(start));
        rollout_bytes = 0;
        for (const at::Tensor& t : rollout_copy) rollout_bytes += t.nbytes();
        if (r > 0 && seconds < best) {
          best = seconds;
          extra = MaxOver(**sockets, static_cast<double>(Peak() - base - rollout_bytes));
        }
      }
      const double bytes_in = MaxOver(**sockets, 2.0 * received);
      const double bound = bytes_in / bandwidth;
      if (rank == 0) {
        nlohmann::json out = {{"preset", absl::GetFlag(FLAGS_preset)},
                              {"ranks", ranks},
                              {"train_dp", ranks},
                              {"rollout_tp", rollout.tp},
                              {"rollout_dp", rollout.dp},
                              {"seconds", best},
                              {"bytes_received_per_rank", bytes_in},
                              {"allgather_receive_gbps", bandwidth / 1e9},
                              {"bound_seconds", bound},
                              {"ratio_to_bound", best / bound},
                              {"rollout_shard_gib", rollout_bytes / double(1 << 30)},
                              {"extra_memory_gib", extra / double(1 << 30)},
                              {"largest_bucket_gib", largest_bucket / double(1 << 30)}};
        std::cout << out.dump() << "\n";
        std::printf("%-13s dp %d -> tp_g %d dp_g %d | %7.1f ms | bound %7.1f ms (%5.1f GB in at %5.1f GB/s) | %4.2fx | extra %.2f GiB beyond the %.2f GiB rollout shard (bucket %.2f GiB)\n",
                    absl::GetFlag(FLAGS_preset).c_str(), ranks, rollout.tp, rollout.dp,
                    1e3 * best, 1e3 * bound, bytes_in / 1e9, bandwidth / 1e9, best / bound,
                    extra / double(1 << 30), rollout_bytes / double(1 << 30),
                    largest_bucket / double(1 << 30));
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int ranks = absl::GetFlag(FLAGS_ranks), rank = absl::GetFlag(FLAGS_rank);
  if (rank >= 0) return RunRank(rank, ranks);
  if (torch::cuda::device_count() < ranks) {
    std::cerr << "reshard_bench needs " << ranks << " GPUs\n";
    return 1;
  }
  // Start one process per GPU (this binary again, with --rank).
  std::vector<pid_t> children;
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> args = {"/proc/self/exe", absl::StrCat("--rank=", r),
                                     absl::StrCat("--ranks=", ranks),
                                     "--preset=" + absl::GetFlag(FLAGS_preset),
                                     "--master=" + absl::GetFlag(FLAGS_master),
                                     absl::StrCat("--repeat=", absl::GetFlag(FLAGS_repeat))};
    std::vector<char*> argv_c;
    for (std::string& a : args) argv_c.push_back(a.data());
    argv_c.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv_c.data(), environ) != 0) {
      std::cerr << "cannot start rank " << r << "\n";
      return 1;
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  return failed == 0 ? 0 : 1;
}
