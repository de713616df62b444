// rlhfctl workers, cluster, drain and undrain.
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/config/proto_json_schema.h"
#include "controller/cli/cli_flags.h"
#include "controller/cli/commands.h"
#include "controller/cli/printing.h"
#include "controller/cli/table.h"

namespace rlhfd::cli {

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
            << " draining, " << reply.workers_lost() << " lost; GPUs alive: " << reply.gpus_alive()
            << "\n";
  for (const auto& [state, count] : reply.jobs_by_state()) {
    const auto* value = v1::JobState_descriptor()->FindValueByName(state);
    std::cout << "jobs " << (value ? config::EnumConfigName(*value) : state) << ": " << count
              << "\n";
  }
  return kExitOk;
}

// The same call shape on two RPCs.
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

}  // namespace rlhfd::cli
