// rlhfd-controller: the composition root. Flags → options → controller state on an event loop →
// gRPC services → serve until SIGTERM/SIGINT, then drain within --shutdown_deadline.
#include <malloc.h>

#include <atomic>
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
#include "common/status/status_macros.h"
#include "common/util/clock.h"
#include "common/util/event_loop.h"
#include "common/util/program_help.h"
#include "common/util/program_setup.h"
#include "common/util/signals.h"
#include "common/util/systemd_notify.h"
#include "controller/api/cluster_service.h"
#include "controller/api/job_service.h"
#include "controller/controller.h"
#include "controller/gateway/http_gateway.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "host:port for the gRPC API; 0.0.0.0:PORT to serve other hosts, port 0 for any free one");
ABSL_FLAG(std::string, state_dir, "/var/lib/rlhfd",
          "Durable state: jobs and the cluster's tokens (token, read_token, stage_token; created "
          "on first start)");
ABSL_FLAG(std::string, port_file, "", "Write the bound port here once serving (for port 0)");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(2), "How often workers heartbeat");
ABSL_FLAG(absl::Duration, liveness_window, absl::Seconds(10),
          "A worker silent this long is marked lost");
ABSL_FLAG(absl::Duration, lost_worker_retention, absl::Hours(1),
          "A lost worker is forgotten (leaves `rlhfctl workers`) this long after it was lost");
ABSL_FLAG(absl::Duration, shutdown_deadline, absl::Seconds(10),
          "On SIGTERM, time given to calls in flight before they are cancelled");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");
ABSL_FLAG(absl::Duration, stage_timeout, absl::Minutes(30),
          "Deadline of each stage call to a worker (a rollout or an update of a large batch)");
ABSL_FLAG(int, stage_relay_above, 64,
          "A stage over more ranks than this reaches them through relaying workers, about the "
          "square root of the ranks of them, each calling its group (0: the controller calls "
          "every rank itself)");
ABSL_FLAG(
    std::string, http_listen, "",
    "host:port of the REST gateway, /metrics and the dashboard (empty: none); the same tokens "
    "and TLS files as gRPC");
ABSL_FLAG(std::string, http_port_file, "", "Write the REST gateway's bound port here (for port 0)");
ABSL_FLAG(std::string, log_dir, "",
          "Where each job's metric logs (trainer.loggers jsonl, tensorboard) go, under <job id>/ "
          "(default: <state_dir>/logs)");
ABSL_FLAG(absl::Duration, collective_timeout, absl::Minutes(5),
          "Deadline of a job's rendezvous and of each collective between its workers: a worker "
          "that stops answering fails the step within it, and the job recovers");

ABSL_FLAG(absl::Duration, checkpoint_disk_full_timeout, absl::Minutes(10),
          "A checkpoint save that finds its disk full (ENOSPC, EDQUOT) is tried again, with "
          "backoff up to 30 s, for this long before its job fails (its previous checkpoint "
          "intact)");

namespace rlhfd {
namespace {

// The admin token (--token, else <state_dir>/token) and the read-only one for clients, and the
// stage token the controller hands its workers; each created on first start.
absl::Status LoadTokens(const std::string& state_dir, ClientTokens& clients, std::string& stage) {
  clients.admin = TokenFlag();
  if (clients.admin.empty()) {
    ASSIGN_OR_RETURN(clients.admin, LoadOrCreateToken(state_dir, kAdminTokenFile));
  }
  ASSIGN_OR_RETURN(clients.read_only, LoadOrCreateToken(state_dir, kReadTokenFile));
  ASSIGN_OR_RETURN(stage, LoadOrCreateToken(state_dir, kStageTokenFile));
  if (clients.read_only == clients.admin || stage == clients.admin) {
    return absl::FailedPreconditionError(
        "the admin token equals read_token or stage_token; delete those files to have new ones "
        "made");
  }
  return absl::OkStatus();
}

// The flags, read once and checked: what main composes the daemon from.
struct DaemonConfig {
  logging::Severity log_severity;
  controller::ControllerOptions controller;
  std::string listen, port_file;
  std::string http_listen, http_port_file;  // the REST gateway (none when http_listen is empty)
  RpcOptions rpc;
  absl::Duration shutdown_deadline;
  absl::Duration stage_timeout, collective_timeout, disk_full_timeout;
  int stage_relay_above = 64;
  std::string log_dir;  // the jobs' metric logs; <state_dir>/logs unless --log_dir says
};

absl::StatusOr<DaemonConfig> ConfigFromFlags() {
  DaemonConfig config;
  if (!logging::ParseSeverity(absl::GetFlag(FLAGS_log_level), &config.log_severity)) {
    return absl::InvalidArgumentError("--log_level must be debug, info, warning or error");
  }
  config.controller.state_dir = absl::GetFlag(FLAGS_state_dir);
  config.controller.liveness.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  config.controller.liveness.liveness_window = absl::GetFlag(FLAGS_liveness_window);
  config.controller.liveness.lost_retention = absl::GetFlag(FLAGS_lost_worker_retention);
  config.listen = absl::GetFlag(FLAGS_listen);
  config.port_file = absl::GetFlag(FLAGS_port_file);
  config.http_listen = absl::GetFlag(FLAGS_http_listen);
  config.http_port_file = absl::GetFlag(FLAGS_http_port_file);
  config.rpc = RpcOptionsFromFlags();
  config.shutdown_deadline = absl::GetFlag(FLAGS_shutdown_deadline);
  config.stage_timeout = absl::GetFlag(FLAGS_stage_timeout);
  config.stage_relay_above = absl::GetFlag(FLAGS_stage_relay_above);
  if (config.stage_relay_above < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stage_relay_above must be 0 (no relays) or a count of ranks, not ",
                     config.stage_relay_above));
  }
  config.collective_timeout = absl::GetFlag(FLAGS_collective_timeout);
  config.disk_full_timeout = absl::GetFlag(FLAGS_checkpoint_disk_full_timeout);
  config.log_dir = absl::GetFlag(FLAGS_log_dir).empty() ? config.controller.state_dir + "/logs"
                                                        : absl::GetFlag(FLAGS_log_dir);
  return config;
}

// The REST gateway when --http_listen asks for one (nullptr otherwise), its port written to
// --http_port_file.
absl::StatusOr<std::unique_ptr<controller::HttpGateway>> StartGateway(
    const DaemonConfig& config, controller::Controller* controller, EventLoop* loop,
    controller::CallMetrics* call_metrics, const ClientTokens& tokens) {
  if (config.http_listen.empty()) return nullptr;
  ASSIGN_OR_RETURN(std::unique_ptr<controller::HttpGateway> gateway,
                   controller::HttpGateway::Start(controller, loop, call_metrics,
                                                  {.listen = config.http_listen,
                                                   .tokens = tokens,
                                                   .tls_cert_file = config.rpc.tls_cert_file,
                                                   .tls_key_file = config.rpc.tls_key_file}));
  RLOG(INFO) << "REST gateway on port " << gateway->port();
  if (!config.http_port_file.empty()) {
    RETURN_IF_ERROR(WritePortFile(config.http_port_file, gateway->port()));
  }
  return gateway;
}

// The loop's periodic work: liveness and placement of waiting jobs twice per heartbeat interval;
// and, each second, handing back to the system the pages gRPC freed after a burst of large
// requests (malloc keeps them), so the daemon's footprint returns to its working size.
void SchedulePeriodicWork(EventLoop& loop, controller::Controller* controller,
                          absl::Duration heartbeat_interval) {
  loop.PostEvery(heartbeat_interval / 2, [controller] { controller->Tick(); });
  loop.PostEvery(absl::Seconds(1), [] { malloc_trim(0); });
}

// The gRPC port to --port_file, the log line, and READY=1 to systemd.
absl::Status AnnounceServing(const DaemonConfig& config, int port) {
  if (!config.port_file.empty()) RETURN_IF_ERROR(WritePortFile(config.port_file, port));
  RLOG(INFO) << "serving on port " << port << ", state in " << config.controller.state_dir
             << ", tokens in " << config.controller.state_dir << "/{token,read_token}";
  NotifyReady(absl::StrCat("serving on port ", port));
  return absl::OkStatus();
}

// After SIGTERM/SIGINT: watch streams end, then the gateway, then the gRPC server within the
// deadline, then the drivers. 0, or an exit at once when the loop stays busy.
int Drain(const DaemonConfig& config, int signal_number, controller::JobServiceImpl& job_service,
          std::unique_ptr<controller::HttpGateway> gateway, RpcServer& server, EventLoop& loop,
          controller::Controller* controller) {
  NotifyStopping();
  RLOG(INFO) << "signal " << signal_number << ": draining (deadline "
             << absl::FormatDuration(config.shutdown_deadline) << ")";
  // Watch streams never end by themselves: end them first, so they do not hold the drain.
  job_service.EndWatches();
  gateway.reset();  // its calls wait for the loop at most their deadline
  // The loop keeps running while the server drains, so calls in flight can finish; calls the
  // loop has not answered by the deadline are cancelled (and answered CANCELLED) by gRPC.
  server.Shutdown(config.shutdown_deadline);
  // Drivers stop (their jobs keep their states: the next controller recovers them); their
  // threads end the workers' roles and report to a loop that will not run them.
  loop.Post([controller] { controller->StopRunner(); });
  if (!loop.StopWithin(absl::Seconds(2))) {
    // Every change was made durable before it was acknowledged, so nothing is lost by leaving
    // now; destroying the controller under a running task is what must not happen.
    RLOG(ERROR) << "the event loop is still busy after the shutdown deadline; exiting without it";
    std::_Exit(1);
  }
  RLOG(INFO) << "stopped";
  return 0;
}

int Run() {
  logging::SetProcessName("controller");
  absl::StatusOr<DaemonConfig> read = ConfigFromFlags();
  if (!read.ok()) {
    std::fprintf(stderr, "%s\n", std::string(read.status().message()).c_str());
    return 2;
  }
  DaemonConfig& config = *read;
  logging::SetMinSeverity(config.log_severity);
  ClientTokens tokens;
  if (absl::Status loaded =
          LoadTokens(config.controller.state_dir, tokens, config.controller.stage_token);
      !loaded.ok()) {
    RLOG(ERROR) << "cannot set up the cluster's tokens: " << loaded.message();
    return 1;
  }
  auto created = controller::Controller::Create(config.controller, NowUnixMillis);
  if (!created.ok()) {
    RLOG(ERROR) << created.status().message();
    return 1;
  }
  std::unique_ptr<controller::Controller> controller = *std::move(created);

  EventLoop loop;
  // What the gRPC adapters and the REST gateway record of each call, for /metrics. Never
  // destroyed: RPC threads may outlive main.
  auto* call_metrics = new controller::CallMetrics();
  controller::ServiceContext context{controller.get(), &loop, tokens, call_metrics};
  controller::JobServiceImpl job_service(context);
  controller::ClusterServiceImpl cluster_service(context);
  controller::WorkerRegistryImpl registry_service(context);
  if (!config.rpc.tls() && !IsLoopbackAddress(config.listen)) {
    RLOG(WARNING) << "serving " << config.listen
                  << " without TLS: tokens and configs cross the network "
                  << "in the clear; set --tls_cert/--tls_key (docs/operations.md)";
  }
  auto server = RpcServer::Start(config.listen, config.rpc,
                                 {&job_service, &cluster_service, &registry_service});
  if (!server.ok()) {
    RLOG(ERROR) << server.status().message();
    return 1;
  }
  controller->StartRunner(
      [&loop](std::function<void()> task) { loop.Post(std::move(task)); },
      {.token = config.controller.stage_token,
       .rpc = config.rpc,
       .stage_deadline = config.stage_timeout,
       .stage_relay_above = config.stage_relay_above,
       .communicator_timeout_ms = absl::ToInt64Milliseconds(config.collective_timeout),
       .log_dir = config.log_dir,
       .disk_full_timeout = config.disk_full_timeout});
  SchedulePeriodicWork(loop, controller.get(), config.controller.liveness.heartbeat_interval);
  absl::StatusOr<std::unique_ptr<controller::HttpGateway>> gateway =
      StartGateway(config, controller.get(), &loop, call_metrics, tokens);
  if (!gateway.ok()) {
    RLOG(ERROR) << gateway.status().message();
    return 1;
  }
  if (absl::Status announced = AnnounceServing(config, (*server)->port()); !announced.ok()) {
    RLOG(ERROR) << announced.message();
    return 1;
  }
  // The watchdog follows the event loop: a loop stuck in a task stops ticking, the pings stop
  // and systemd restarts the controller (which recovers its jobs). The loop itself never sends.
  std::atomic<int64_t> loop_tick_ms{NowUnixMillis()};
  const absl::Duration ping = WatchdogPingInterval();
  if (ping > absl::ZeroDuration()) {
    loop.PostEvery(ping / 2, [&loop_tick_ms] { loop_tick_ms = NowUnixMillis(); });
  }
  const WatchdogPinger watchdog([&loop_tick_ms, ping] {
    return NowUnixMillis() - loop_tick_ms.load() <= absl::ToInt64Milliseconds(ping * 2);
  });

  const int signal_number = WaitForTerminationSignal();
  return Drain(config, signal_number, job_service, *std::move(gateway), **server, loop,
               controller.get());
}

}  // namespace
}  // namespace rlhfd

int main(int argc, char** argv) {
  rlhfd::SetUpProgram();
  // The gateway's and gRPC's threads would each get a malloc arena, whose freed pages malloc_trim
  // returns less well; a control-plane daemon needs few.
  mallopt(M_ARENA_MAX, 2);
  rlhfd::BlockTerminationSignals();
  constexpr char kUsage[] =
      "rlhfd-controller --state_dir=DIR [--listen=HOST:PORT] [flags]\n"
      "The rlhfd cluster controller: worker registry, job queue and store, the public API.\n"
      "Workers and rlhfctl find it at --listen and authenticate with <state_dir>/token (read-only "
      "clients: <state_dir>/read_token).";
  rlhfd::HandleHelp(argc, argv, kUsage);
  absl::SetProgramUsageMessage(kUsage);
  absl::ParseCommandLine(argc, argv);
  return rlhfd::Run();
}
