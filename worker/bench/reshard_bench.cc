// reshard_bench: time to reshard actor weights of a preset shape from the training layout
// (dp = ranks, flat ZeRO shards) to rollout layouts (tp_g = ranks, and tp_g = 1), over NCCL, one
// process per GPU, the whole model in one call at each bucket size; beside the bound measured in
// the same run: the bytes that must reach each rank over the GPU link, over the all-gather
// bandwidth the link gives. Also the extra GPU memory the reshard takes beyond the rollout copy,
// against one bucket. Prints JSON and a table.
//   reshard_bench --preset=qwen2.5-7b --ranks=2 --bucket_mib=64,256
//   (starts one process per GPU itself)
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
#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/util/program_setup.h"
#include "common/util/stopwatch.h"
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
ABSL_FLAG(std::string, bucket_mib, "1024", "Bucket sizes to measure (comma-separated MiB)");

namespace {

using Clock = std::chrono::steady_clock;
using rlhfd::SecondsSince;
using rlhfd::parallel::Communicator;

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

  // The link's bandwidths: all-gather (each rank receives (ranks - 1) GiB-sized pieces) and a
  // pairwise send/recv exchange of the same size (what Reshard's messages use).
  const int64_t piece = int64_t{1} << 29;  // 512 Mi bf16 elements = 1 GiB
  double allgather_bandwidth = 0, exchange_bandwidth = 0;
  {
    at::Tensor input = at::ones({piece}, bf16), output = at::empty({piece * ranks}, bf16);
    (void)world.AllGather(input, output);
    auto start = Clock::now();
    for (int i = 0; i < 5; ++i) (void)world.AllGather(input, output);
    double seconds = SecondsSince(start) / 5;
    allgather_bandwidth = -MaxOver(**sockets, -2.0 * piece * (ranks - 1) / seconds);
    // Exchange: every rank sends the same piece to, and receives one from, every other rank.
    std::vector<rlhfd::parallel::PeerTransfer> transfers;
    for (int peer = 0; peer < ranks; ++peer) {
      if (peer == rank) continue;
      transfers.push_back({rlhfd::parallel::PeerTransfer::Direction::kSend, peer, input});
      transfers.push_back({rlhfd::parallel::PeerTransfer::Direction::kRecv, peer,
                           output.narrow(0, peer * piece, piece)});
    }
    (void)world.SendRecv(transfers);
    start = Clock::now();
    for (int i = 0; i < 5; ++i) (void)world.SendRecv(transfers);
    seconds = SecondsSince(start) / 5;
    exchange_bandwidth = -MaxOver(**sockets, -2.0 * piece * (ranks - 1) / seconds);
  }
  c10::cuda::CUDACachingAllocator::emptyCache();

  // Training shards (dp = ranks, tp = 1), random values, in the model's order.
  const rlhfd::parallel::TrainLayout train{.dp = ranks, .tp = 1};
  const std::vector<rlhfd::parallel::ShardedParameter> specs =
      rlhfd::parallel::TensorParallelSpecs(*config);
  std::vector<at::Tensor> shards;
  int64_t model_bytes = 0;
  for (const auto& spec : specs) {
    shards.push_back(at::randn({rlhfd::parallel::TrainShardNumel(spec, train, rank)}, bf16));
    int64_t numel = 1;
    for (int64_t d : spec.shape) numel *= d;
    model_bytes += numel * 2;
  }
  c10::cuda::device_synchronize();
  for (const rlhfd::parallel::RolloutLayout rollout :
       {rlhfd::parallel::RolloutLayout{.tp = ranks, .dp = 1},
        rlhfd::parallel::RolloutLayout{.tp = 1, .dp = ranks}}) {
    for (const absl::string_view mib : absl::StrSplit(absl::GetFlag(FLAGS_bucket_mib), ',')) {
      rlhfd::parallel::ReshardOptions options;
      int bucket_mib = 0;
      if (!absl::SimpleAtoi(mib, &bucket_mib) || bucket_mib <= 0) {
        std::cerr << "--bucket_mib: positive integers, got " << mib << "\n";
        return 2;
      }
      options.bucket_bytes = int64_t{bucket_mib} << 20;
      std::vector<at::ScalarType> dtypes(specs.size(), at::kBFloat16);
      const auto plan_start = Clock::now();
      auto plan = rlhfd::parallel::ReshardPlan::Create(world, specs, dtypes, train, rollout, device,
                                                       options);
      const double plan_seconds = MaxOver(**sockets, SecondsSince(plan_start));
      if (!plan.ok()) {
        std::cerr << plan.status() << "\n";
        return 1;
      }
      const rlhfd::parallel::ReshardStats& stats = plan->stats();
      double best = 1e30, extra = 0;
      rlhfd::parallel::ReshardTiming timing, best_timing;
      int64_t rollout_bytes = 0;
      for (int r = 0; r <= absl::GetFlag(FLAGS_repeat); ++r) {  // r = 0: warm-up
        c10::cuda::device_synchronize();
        c10::cuda::CUDACachingAllocator::resetPeakStats(rank);
        const int64_t base = Allocated();
        const auto start = Clock::now();
        auto slices = plan->Run(world, shards, &timing);
        if (!slices.ok()) {
          std::cerr << slices.status() << "\n";
          return 1;
        }
        c10::cuda::device_synchronize();
        const double seconds = MaxOver(**sockets, SecondsSince(start));
        rollout_bytes = Allocated() - base;  // The slices' one allocation (the rest are views).
        if (r > 0 && seconds < best) {
          best = seconds;
          best_timing = timing;
          extra = MaxOver(**sockets, static_cast<double>(Peak() - base - rollout_bytes));
        }
      }
      const double bytes_in = MaxOver(**sockets, static_cast<double>(stats.received_bytes));
      const double bound = bytes_in / allgather_bandwidth;
      if (rank == 0) {
        nlohmann::json out = {
            {"preset", absl::GetFlag(FLAGS_preset)},
            {"ranks", ranks},
            {"train_dp", ranks},
            {"rollout_tp", rollout.tp},
            {"rollout_dp", rollout.dp},
            {"bucket_mib", bucket_mib},
            {"buckets", stats.buckets},
            {"plan_seconds", plan_seconds},
            {"seconds", best},
            {"bytes_received_per_rank", bytes_in},
            {"allgather_receive_gbps", allgather_bandwidth / 1e9},
            {"exchange_receive_gbps", exchange_bandwidth / 1e9},
            {"bound_seconds", bound},
            {"ratio_to_bound", best / bound},
            {"model_gib", model_bytes / double(1 << 30)},
            {"rollout_copy_gib", rollout_bytes / double(1 << 30)},
            {"shard_view_gib", stats.shared_bytes / double(1 << 30)},
            {"extra_memory_gib", extra / double(1 << 30)},
            {"buffer_gib", stats.buffer_bytes / double(1 << 30)},
            {"rank0_first_pack_queued_ms", 1e3 * best_timing.first_pack_queued},
            {"rank0_first_transfer_queued_ms", 1e3 * best_timing.first_transfer_queued},
            {"rank0_all_queued_ms", 1e3 * best_timing.all_queued},
            {"rank0_done_ms", 1e3 * best_timing.done}};
        std::cout << out.dump() << "\n";
        std::printf(
            "%-13s dp %d -> tp_g %d dp_g %d | bucket %5d MiB x %3lld | %7.2f ms | bound %6.2f ms "
            "(%5.2f GB in; all-gather %5.1f GB/s, send/recv %5.1f GB/s) | %5.2fx | extra %.3f GiB "
            "beyond the rollout copy (%.2f GiB allocated + %.2f GiB views of the shard) | plan "
            "%.1f ms\n",
            absl::GetFlag(FLAGS_preset).c_str(), ranks, rollout.tp, rollout.dp, bucket_mib,
            static_cast<long long>(stats.buckets), 1e3 * best, 1e3 * bound, bytes_in / 1e9,
            allgather_bandwidth / 1e9, exchange_bandwidth / 1e9, best / bound,
            extra / double(1 << 30), rollout_bytes / double(1 << 30),
            stats.shared_bytes / double(1 << 30), 1e3 * plan_seconds);
        std::printf(
            "    rank 0 host: first pack queued %.3f ms, its transfer %.3f ms, all queued %.3f ms, "
            "done %.3f ms\n",
            1e3 * best_timing.first_pack_queued, 1e3 * best_timing.first_transfer_queued,
            1e3 * best_timing.all_queued, 1e3 * best_timing.done);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  rlhfd::SetUpProgram();
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
    std::vector<std::string> args = {"/proc/self/exe",
                                     absl::StrCat("--rank=", r),
                                     absl::StrCat("--ranks=", ranks),
                                     "--preset=" + absl::GetFlag(FLAGS_preset),
                                     "--master=" + absl::GetFlag(FLAGS_master),
                                     absl::StrCat("--repeat=", absl::GetFlag(FLAGS_repeat)),
                                     "--bucket_mib=" + absl::GetFlag(FLAGS_bucket_mib)};
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
