// rlhfd-worker: the composition root of a worker. Flags → device probe → WorkerService server →
// controller link (register + heartbeat) → serve until SIGTERM/SIGINT, then drain.
#include <ATen/Device.h>
#include <ATen/Parallel.h>
#include <arpa/inet.h>
#include <netdb.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/logging/logging.h"
#include "common/rpc/auth.h"
#include "common/rpc/rpc_flags.h"
#include "common/rpc/rpc_server.h"
#include "common/util/clock.h"
#include "common/util/program_help.h"
#include "common/util/program_setup.h"
#include "common/util/signals.h"
#include "common/util/systemd_notify.h"
#include "worker/device/device_probe.h"
#include "worker/roles/role_host.h"
#include "worker/service/controller_link.h"
#include "worker/service/worker_service.h"

ABSL_FLAG(std::string, controller, "127.0.0.1:50051", "host:port of rlhfd-controller");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "host:port for this worker's gRPC service; port 0 picks a free one");
ABSL_FLAG(std::string, advertise_address, "",
          "host:port the controller should call; default: the listen host and bound port");
ABSL_FLAG(std::string, device, "auto", "auto (GPU --gpu_index if present, else CPU), cpu, cuda:N");
ABSL_FLAG(int, gpu_index, 0, "GPU used by --device=auto");
ABSL_FLAG(
    int, cpu_threads, 1,
    "LibTorch's threads for the worker's CPU arithmetic. One by default: a host runs a worker "
    "per device, and several CPU workers with a thread per core each would oversubscribe "
    "its cores (every parallel region then waits on a descheduled thread). Raise it for a "
    "single CPU worker on a many-core host");
ABSL_FLAG(std::string, worker_id, "",
          "Stable id; default <host>-cuda<N> for a GPU, <host>-cpu-<port> for a CPU worker");
ABSL_FLAG(std::string, port_file, "", "Write the bound port here once serving");
ABSL_FLAG(absl::Duration, rpc_timeout, absl::Seconds(5), "Deadline of each call to the controller");
ABSL_FLAG(absl::Duration, shutdown_deadline, absl::Seconds(10),
          "On SIGTERM, time given to calls in flight");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");
ABSL_FLAG(std::string, data_plane_host, "",
          "IPv4 address other workers reach this one at for a job's CPU communicator; default: "
          "the advertised host (resolved)");
ABSL_FLAG(absl::Duration, collective_timeout, absl::Minutes(5),
          "Deadline of a job's rendezvous and of each collective when the job sets none");
ABSL_FLAG(absl::Duration, fault_hold_background_save, absl::ZeroDuration(),
          "Fault drills only: a background checkpoint save (trainer.async_save) waits this long "
          "before it writes its files, so a drill can kill the worker mid-save");
ABSL_FLAG(absl::Duration, fault_hold_rollout_decode_step, absl::ZeroDuration(),
          "Fault drills only: each decode step of a rollout pool's rank (roles.rollout) waits "
          "this long, so that a weight update interrupts a partial rollout mid-generation");
ABSL_FLAG(absl::Duration, fault_hold_checkpoint_upload, absl::ZeroDuration(),
          "Fault drills only: each checkpoint upload (trainer.checkpoint_uri) waits this long "
          "between a rank's data files and its manifest, so a drill can kill the worker "
          "mid-upload");

namespace rlhfd {
namespace {

std::string AdvertisedAddress(const std::string& listen, int port, const std::string& host) {
  if (!absl::GetFlag(FLAGS_advertise_address).empty())
    return absl::GetFlag(FLAGS_advertise_address);
  std::string listen_host = listen.substr(0, listen.rfind(':'));
  if (listen_host.empty() || listen_host == "0.0.0.0" || listen_host == "[::]") listen_host = host;
  return absl::StrCat(listen_host, ":", port);
}

// An IPv4 address for `host` (a literal, or the first IPv4 address it resolves to).
absl::StatusOr<std::string> Ipv4Of(const std::string& host) {
  in_addr literal{};
  if (inet_pton(AF_INET, host.c_str(), &literal) == 1) return host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot resolve '", host, "' to an IPv4 address; pass --data_plane_host=<IPv4>"));
  }
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, text, sizeof(text));
  freeaddrinfo(found);
  return std::string(text);
}

int Run() {
  logging::Severity severity;
  if (!logging::ParseSeverity(absl::GetFlag(FLAGS_log_level), &severity)) {
    std::fprintf(stderr, "--log_level must be debug, info, warning or error\n");
    return 2;
  }
  logging::SetMinSeverity(severity);
  logging::SetProcessName("worker");

  auto capacity = worker::ProbeDevice(absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_gpu_index));
  if (!capacity.ok()) {
    RLOG(ERROR) << capacity.status().message();
    return 1;
  }
  auto token = ResolveClientToken(TokenFlag(), TokenFileFlag());
  if (!token.ok()) {
    RLOG(ERROR) << token.status().message();
    return 1;
  }
  if (const int threads = absl::GetFlag(FLAGS_cpu_threads); threads >= 1 && threads <= 1024) {
    at::set_num_threads(threads);
  } else {
    RLOG(ERROR) << "--cpu_threads must be 1-1024, not " << threads;
    return 2;
  }
  const RpcOptions rpc_options = RpcOptionsFromFlags();
  auto channel = MakeChannel(absl::GetFlag(FLAGS_controller), rpc_options);
  if (!channel.ok()) {
    RLOG(ERROR) << channel.status().message();
    return 1;
  }

  const std::string listen = absl::GetFlag(FLAGS_listen);
  std::string data_plane_host = absl::GetFlag(FLAGS_data_plane_host);
  if (data_plane_host.empty()) {
    const std::string advertised = AdvertisedAddress(listen, 0, capacity->host());
    auto resolved = Ipv4Of(advertised.substr(0, advertised.rfind(':')));
    if (!resolved.ok()) {
      RLOG(ERROR) << resolved.status().message();
      return 1;
    }
    data_plane_host = *resolved;
  }
  roles::RoleHost role_host(
      {.device =
           capacity->device_kind() == v1::DEVICE_KIND_CUDA
               ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(capacity->device_index()))
               : at::Device(at::kCPU),
       .host = data_plane_host,
       .collective_timeout = absl::ToChronoMilliseconds(absl::GetFlag(FLAGS_collective_timeout)),
       .fault_hold_background_save = absl::GetFlag(FLAGS_fault_hold_background_save),
       .fault_hold_checkpoint_upload = absl::GetFlag(FLAGS_fault_hold_checkpoint_upload),
       .fault_hold_rollout_decode_step = absl::GetFlag(FLAGS_fault_hold_rollout_decode_step)});
  worker::ControllerLinkOptions link_options;
  link_options.token = *token;
  link_options.rpc_timeout = absl::GetFlag(FLAGS_rpc_timeout);
  // Each heartbeat lists the attempts hosted here; those the controller has moved on from (while
  // this worker hung or was cut off) end.
  link_options.hosted = [&role_host] { return role_host.HostedAttempts(); };
  link_options.on_heartbeat = [&role_host](const v1::HeartbeatReply& reply,
                                           std::chrono::steady_clock::time_point sent) {
    role_host.EndMovedOn({reply.end().begin(), reply.end().end()}, sent);
  };
  worker::ControllerLink link(v1::WorkerRegistry::NewStub(*channel), link_options, *capacity);
  // Fan-out through the workers: this worker makes a group of ranks' stage calls when the
  // controller hands it them (Relay), reaching the others as it reaches the controller.
  worker::StageRelay relay(rpc_options);
  worker::WorkerServiceImpl service(
      &link, &role_host, &relay,
      [&role_host] {
        return worker::HostedStatus{.jobs = role_host.jobs(),
                                    .memory_in_use_bytes = role_host.MemoryInUse()};
      },
      // A call racing the first registration's reply waits for it (bounded) rather than fail.
      [&link] { return link.WaitForStageToken(absl::Seconds(5)); }, NowUnixMillis());
  auto server = RpcServer::Start(listen, rpc_options, {&service});
  if (!server.ok()) {
    RLOG(ERROR) << server.status().message();
    return 1;
  }
  const int port = (*server)->port();

  // The default id of a CPU worker includes its port, which is known only once bound.
  std::string worker_id = absl::GetFlag(FLAGS_worker_id);
  if (worker_id.empty()) {
    worker_id = capacity->device_kind() == v1::DEVICE_KIND_CUDA
                    ? absl::StrCat(capacity->host(), "-cuda", capacity->device_index())
                    : absl::StrCat(capacity->host(), "-cpu-", port);
  }
  logging::SetProcessName(absl::StrCat("worker/", worker_id));
  link.Start(worker_id, AdvertisedAddress(listen, port, capacity->host()));
  if (const std::string port_file = absl::GetFlag(FLAGS_port_file); !port_file.empty()) {
    if (auto written = WritePortFile(port_file, port); !written.ok()) {
      RLOG(ERROR) << written.message();
      return 1;
    }
  }
  RLOG(INFO) << "serving on port " << port << " (" << capacity->device_name() << "), controller "
             << absl::GetFlag(FLAGS_controller);
  NotifyReady(absl::StrCat(worker_id, " serving on port ", port, ", controller ",
                           absl::GetFlag(FLAGS_controller)));
  // Long stages keep the worker's executor busy for minutes, so the pings come from a thread of
  // their own: systemd restarts a worker whose process hangs or stops; a worker that is alive but
  // stuck is the controller's to detect (heartbeats, stage deadlines).
  const WatchdogPinger watchdog;

  const int signal_number = WaitForTerminationSignal();
  NotifyStopping();
  RLOG(INFO) << "signal " << signal_number << ": draining";
  link.Stop();
  (*server)->Shutdown(absl::GetFlag(FLAGS_shutdown_deadline));
  // Stages run on the role host's executor: a decode loop or a training step on the CPU can
  // hold it for minutes, and its call's cancellation is seen only when it returns. Past a grace
  // the worker exits without it, as systemd's SIGKILL would later (the controller resumes the
  // job from its last committed checkpoint). With no stage in hand it ends its jobs normally,
  // background saves included.
  constexpr absl::Duration kStageGrace = absl::Seconds(5);
  if (!role_host.StopWithin(kStageGrace)) {
    RLOG(WARNING) << "a stage still running " << absl::FormatDuration(kStageGrace)
                  << " after the calls stopped: exiting without it";
    std::fflush(nullptr);
    std::_Exit(0);
  }
  RLOG(INFO) << "stopped";
  return 0;
}

}  // namespace
}  // namespace rlhfd

int main(int argc, char** argv) {
  rlhfd::SetUpProgram();
  rlhfd::BlockTerminationSignals();
  constexpr char kUsage[] =
      "rlhfd-worker --controller=HOST:PORT --token_file=FILE [--device=auto|cpu|cuda:N] [flags]\n"
      "An rlhfd worker: one per GPU (or CPU slot); registers with the controller and runs the\n"
      "roles it is given. The token is the controller's <state_dir>/token ($RLHFD_TOKEN_FILE).";
  rlhfd::HandleHelp(argc, argv, kUsage);
  absl::SetProgramUsageMessage(kUsage);
  absl::ParseCommandLine(argc, argv);
  return rlhfd::Run();
}
