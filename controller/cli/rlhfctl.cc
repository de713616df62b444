// rlhfctl: the command-line client of the rlhfd control plane. Tables for people, --json for
// scripts; exit 0 on success, 1 when the controller refuses or cannot be reached, 2 for usage.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/client_context.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/config/job_validator.h"
#include "common/config/proto_json_schema.h"
#include "common/rpc/auth.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/rpc_flags.h"
#include "common/util/clock.h"
#include "common/util/files.h"
#include "controller/cli/table.h"
#include "rlhfd/v1/cluster_service.grpc.pb.h"
#include "rlhfd/v1/job_service.grpc.pb.h"

ABSL_FLAG(std::string, controller, "",
          "host:port of rlhfd-controller (default $RLHFD_CONTROLLER or 127.0.0.1:50051)");
ABSL_FLAG(bool, json, false, "Print replies as JSON for scripts");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10), "Deadline of each call");

namespace rlhfd::cli {
namespace {

constexpr char kUsage[] = R"(rlhfctl [flags] COMMAND [ARGS]

Commands:
  workers          list registered workers
  cluster          counts of workers, GPUs and jobs
  submit FILE      validate a job config (YAML/JSON) and queue the job
  jobs             list jobs
  status JOB       show one job
  cancel JOB       cancel a job
  watch JOB        follow a job's events until it ends
  drain WORKER     send a worker no new work (lasts across restarts)
  undrain WORKER   lift a drain: the worker takes new work again

Flags: --controller=HOST:PORT --token_file=FILE (or $RLHFD_TOKEN) --json --timeout=10s
)";

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

std::string ControllerAddress() {
  std::string address = absl::GetFlag(FLAGS_controller);
  if (address.empty()) {
    const char* env = std::getenv("RLHFD_CONTROLLER");
    address = env != nullptr && *env != '\0' ? env : "127.0.0.1:50051";
  }
  return address;
}

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

std::string ShortEnum(const google::protobuf::EnumDescriptor* type, int value) {
  const auto* descriptor = type->FindValueByNumber(value);
  return descriptor ? config::EnumConfigName(*descriptor) : absl::StrCat(value);
}

std::string Bytes(int64_t bytes) {
  if (bytes < 0) return "-";
  return absl::StrFormat("%.1f GiB", bytes / double(1 << 30));
}

std::string Ago(int64_t time_ms) {
  if (time_ms <= 0) return "-";
  const int64_t seconds = (NowUnixMillis() - time_ms) / 1000;
  if (seconds < 120) return absl::StrCat(seconds, "s ago");
  if (seconds < 7200) return absl::StrCat(seconds / 60, "m ago");
  return absl::StrCat(seconds / 3600, "h ago");
}

class Client {
 public:
  Client(std::shared_ptr<grpc::Channel> channel, std::string token)
      : jobs_(v1::JobService::NewStub(channel)),
        cluster_(v1::ClusterService::NewStub(channel)),
        token_(std::move(token)) {}

  void Prepare(grpc::ClientContext* context, bool with_deadline = true) const {
    AttachToken(context, token_);
    if (with_deadline) {
      context->set_deadline(absl::ToChronoTime(absl::Now() + absl::GetFlag(FLAGS_timeout)));
    }
  }

  v1::JobService::Stub& jobs() { return *jobs_; }
  v1::ClusterService::Stub& cluster() { return *cluster_; }

 private:
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::ClusterService::Stub> cluster_;
  std::string token_;
};

int Fail(const grpc::Status& status) {
  std::string hint;
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    hint = absl::StrCat("\nhint: is rlhfd-controller running at ", ControllerAddress(),
                        "? Set --controller or $RLHFD_CONTROLLER.");
  }
  std::cerr << "error: " << status.error_message() << hint << "\n";
  return kExitFailed;
}

void PrintJob(const v1::Job& job) {
  std::cout << "job:      " << job.job_id() << "\n"
            << "name:     " << job.spec().name() << "\n"
            << "state:    " << ShortEnum(v1::JobState_descriptor(), job.state()) << "\n"
            << "message:  " << job.message() << "\n"
            << "source:   " << job.source() << "\n"
            << "model:    " << job.spec().model().path() << "\n"
            << "gpus:     " << config::TotalGpus(job.spec()) << "\n"
            << "submitted " << Ago(job.submit_time_ms()) << ", updated "
            << Ago(job.update_time_ms()) << "\n";
}

int Workers(Client& client) {
  grpc::ClientContext context;
  client.Prepare(&context);
  v1::ListWorkersReply reply;
  if (auto status = client.cluster().ListWorkers(&context, {}, &reply); !status.ok()) {
    return Fail(status);
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << ToJson(reply) << "\n";
    return kExitOk;
  }
  Table table({"WORKER", "STATE", "DEVICE", "NAME", "MEMORY", "FREE", "ADDRESS", "HEARTBEAT"});
  for (const v1::Worker& worker : reply.workers()) {
    const auto& capacity = worker.capacity();
    std::string device = ShortEnum(v1::DeviceKind_descriptor(), capacity.device_kind());
    if (capacity.device_index() >= 0) absl::StrAppend(&device, ":", capacity.device_index());
    table.AddRow({worker.worker_id(), ShortEnum(v1::WorkerState_descriptor(), worker.state()),
                  device, capacity.device_name(), Bytes(capacity.memory_total_bytes()),
                  Bytes(capacity.memory_free_bytes()), worker.address(),
                  Ago(worker.last_heartbeat_time_ms())});
  }
  table.Print(std::cout);
  return kExitOk;
}

int Cluster(Client& client) {
  grpc::ClientContext context;
  client.Prepare(&context);
  v1::GetClusterReply reply;
  if (auto status = client.cluster().GetCluster(&context, {}, &reply); !status.ok()) {
    return Fail(status);
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << ToJson(reply) << "\n";
    return kExitOk;
  }
  std::cout << "controller " << reply.controller_version() << ", up since "
            << Ago(reply.controller_start_time_ms()) << "\n"
            << "workers: " << reply.workers_alive() << " alive, " << reply.workers_draining()
            << " draining, " << reply.workers_lost() << " lost; GPUs alive: "
            << reply.gpus_alive() << "\n";
  for (const auto& [state, count] : reply.jobs_by_state()) {
    const auto* value = v1::JobState_descriptor()->FindValueByName(state);
    std::cout << "jobs " << (value ? config::EnumConfigName(*value) : state) << ": " << count
              << "\n";
  }
  return kExitOk;
}

int Submit(Client& client, const std::string& path) {
  auto text = ReadFileToString(path, 1 << 20);
  if (!text.ok()) {
    std::cerr << "error: " << text.status().message() << "\n";
    return kExitUsage;
  }
  v1::SubmitJobRequest request;
  request.set_config_text(*text);
  request.set_config_name(path);
  grpc::ClientContext context;
  client.Prepare(&context);
  v1::SubmitJobReply reply;
  if (auto status = client.jobs().SubmitJob(&context, request, &reply); !status.ok()) {
    return Fail(status);
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << ToJson(reply) << "\n";
  } else {
    std::cout << "submitted " << reply.job().job_id() << " (" << reply.job().spec().name()
              << "): " << ShortEnum(v1::JobState_descriptor(), reply.job().state()) << "\n";
  }
  return kExitOk;
}

int Jobs(Client& client) {
  grpc::ClientContext context;
  client.Prepare(&context);
  v1::ListJobsReply reply;
  if (auto status = client.jobs().ListJobs(&context, {}, &reply); !status.ok()) {
    return Fail(status);
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << ToJson(reply) << "\n";
    return kExitOk;
  }
  Table table({"JOB", "NAME", "STATE", "GPUS", "SUBMITTED", "MESSAGE"});
  for (const v1::Job& job : reply.jobs()) {
    table.AddRow({job.job_id(), job.spec().name(),
                  ShortEnum(v1::JobState_descriptor(), job.state()),
                  absl::StrCat(config::TotalGpus(job.spec())), Ago(job.submit_time_ms()),
                  job.message()});
  }
  table.Print(std::cout);
  return kExitOk;
}

int Status(Client& client, const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  grpc::ClientContext context;
  client.Prepare(&context);
  v1::GetJobReply reply;
  if (auto status = client.jobs().GetJob(&context, request, &reply); !status.ok()) {
    return Fail(status);
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << ToJson(reply) << "\n";
  } else {
    PrintJob(reply.job());
  }
  return kExitOk;
}

int Cancel(Client& client, const std::string& job_id) {
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  grpc::ClientContext context;
  client.Prepare(&context);
  v1::CancelJobReply reply;
  if (auto status = client.jobs().CancelJob(&context, request, &reply); !status.ok()) {
    return Fail(status);
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << ToJson(reply) << "\n";
  } else {
    std::cout << "cancelled " << reply.job().job_id() << "\n";
  }
  return kExitOk;
}

int Watch(Client& client, const std::string& job_id) {
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  grpc::ClientContext context;
  client.Prepare(&context, /*with_deadline=*/false);  // A watch lasts as long as the job.
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader =
      client.jobs().WatchJob(&context, request);
  v1::JobEvent event;
  while (reader->Read(&event)) {
    if (absl::GetFlag(FLAGS_json)) {
      std::string json;
      google::protobuf::util::JsonPrintOptions options;
      options.preserve_proto_field_names = true;
      (void)google::protobuf::util::MessageToJsonString(event, &json, options);
      std::cout << json << std::endl;
      continue;
    }
    std::cout << absl::FormatTime("%H:%M:%S", absl::FromUnixMillis(event.time_ms()),
                                  absl::LocalTimeZone())
              << " " << ShortEnum(v1::JobState_descriptor(), event.state());
    if (event.step() > 0) std::cout << " step " << event.step();
    for (const auto& [name, value] : event.metrics()) std::cout << " " << name << "=" << value;
    if (!event.message().empty()) std::cout << " " << event.message();
    std::cout << std::endl;
  }
  if (grpc::Status status = reader->Finish(); !status.ok()) return Fail(status);
  return kExitOk;
}

// drain and undrain: the same call shape on two RPCs.
int SetDrained(Client& client, const std::string& worker_id, bool drained) {
  grpc::ClientContext context;
  client.Prepare(&context);
  v1::Worker worker;
  std::string json;
  grpc::Status status;
  if (drained) {
    v1::DrainWorkerRequest request;
    request.set_worker_id(worker_id);
    v1::DrainWorkerReply reply;
    status = client.cluster().DrainWorker(&context, request, &reply);
    worker = reply.worker();
    json = ToJson(reply);
  } else {
    v1::UndrainWorkerRequest request;
    request.set_worker_id(worker_id);
    v1::UndrainWorkerReply reply;
    status = client.cluster().UndrainWorker(&context, request, &reply);
    worker = reply.worker();
    json = ToJson(reply);
  }
  if (!status.ok()) return Fail(status);
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << json << "\n";
  } else {
    std::cout << (drained ? "draining " : "undrained ") << worker.worker_id() << "\n";
  }
  return kExitOk;
}

int Run(const std::vector<char*>& args) {
  // Command → number of arguments it takes.
  static const std::map<std::string, size_t> kCommands = {
      {"workers", 0}, {"cluster", 0}, {"jobs", 0},  {"submit", 1},
      {"status", 1},  {"cancel", 1},  {"watch", 1}, {"drain", 1}, {"undrain", 1}};
  if (args.size() < 2) {
    std::cerr << kUsage;
    return kExitUsage;
  }
  const std::string command = args[1];
  auto known = kCommands.find(command);
  if (known == kCommands.end()) {
    std::cerr << "unknown command '" << command << "'\n\n" << kUsage;
    return kExitUsage;
  }
  if (args.size() != 2 + known->second) {
    std::cerr << "usage: rlhfctl " << command << (known->second ? " ARG" : "") << "\n";
    return kExitUsage;
  }
  auto token = ResolveClientToken(TokenFlag(), TokenFileFlag());
  if (!token.ok()) {
    std::cerr << "error: " << token.status().message() << "\n";
    return kExitUsage;
  }
  auto channel = MakeChannel(ControllerAddress(), RpcOptionsFromFlags());
  if (!channel.ok()) {
    std::cerr << "error: " << channel.status().message() << "\n";
    return kExitUsage;
  }
  Client client(*channel, *token);
  if (command == "workers") return Workers(client);
  if (command == "cluster") return Cluster(client);
  if (command == "jobs") return Jobs(client);
  if (command == "submit") return Submit(client, args[2]);
  if (command == "status") return Status(client, args[2]);
  if (command == "cancel") return Cancel(client, args[2]);
  if (command == "watch") return Watch(client, args[2]);
  return SetDrained(client, args[2], /*drained=*/command == "drain");
}

}  // namespace
}  // namespace rlhfd::cli

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(rlhfd::cli::kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  return rlhfd::cli::Run(args);
}
