// rlhfctl: the command-line client of the rlhfd control plane. Tables for people, --json for
// scripts; exit 0 on success, 1 when the controller refuses or cannot be reached, 2 for usage.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/client_context.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config/config_printer.h"
#include "common/config/job_config.h"
#include "common/config/job_defaults.h"
#include "common/config/job_validator.h"
#include "common/config/proto_json_schema.h"
#include "common/config/verl_import.h"
#include "common/rpc/auth.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/rpc_flags.h"
#include "common/status/status_macros.h"
#include "common/util/clock.h"
#include "common/util/files.h"
#include "common/util/metric_value.h"
#include "common/util/program_help.h"
#include "controller/cli/table.h"
#include "controller/jobs/submit_checks.h"
#include "rlhfd/v1/cluster_service.grpc.pb.h"
#include "rlhfd/v1/job_service.grpc.pb.h"

ABSL_FLAG(std::string, controller, "",
          "host:port of rlhfd-controller (default $RLHFD_CONTROLLER or 127.0.0.1:50051)");
ABSL_FLAG(bool, json, false, "Print replies as JSON for scripts");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10), "Deadline of each call");
ABSL_FLAG(bool, wait, false,
          "submit: follow the job to its end with a progress line (step/total, ETA, reward); the "
          "exit code is its outcome (0 succeeded, 1 otherwise)");
ABSL_FLAG(bool, follow, false, "metrics: keep printing new steps until the job ends");
ABSL_FLAG(std::string, out, "", "export: the directory to write the Hugging Face model to");
ABSL_FLAG(int64_t, step, 0, "export: the checkpoint's step (default: the job's newest)");
ABSL_FLAG(int32_t, page_size, 0,
          "jobs: jobs per ListJobs call (0: the controller's default, 100; at most 1000); every "
          "page is listed either way");

namespace rlhfd::cli {
namespace {

constexpr char kUsage[] = R"(rlhfctl [flags] COMMAND [ARGS]: the command line of an rlhfd cluster.

Jobs:
  submit FILE [key=value ...]       validate a job config (YAML/JSON) on the controller and queue
                                    it; key.path=value overrides (Hydra style, ~key removes one);
                                    --wait follows it to its end with a progress line
  submit --from-verl FILE|- [k=v ...]   the same from a verl config and verl overrides
  validate FILE [key=value ...]     check a config here, offline: every problem at once, or the
                                    effective config with defaults and derived values marked
  convert-verl FILE|- [k=v ...]     print the rlhfd config a verl config (and overrides) means;
                                    what is not supported goes to stderr ('-': verl's defaults)
  jobs                              list jobs, oldest first (every page of them)
  status JOB                        one job, and why it is in its state
  watch JOB                         follow a job's events (states, each step's key metrics)
  metrics JOB                       a job's per-step metric history (--json: every metric;
                                    --follow: new steps as they come, to the job's end)
  export JOB --out DIR [--step N]   copy a checkpoint's actor, a Hugging Face directory, to DIR
                                    (the checkpoint directory must be readable here)
  cancel JOB                        cancel a job that has not ended
  delete JOB                        forget an ended job
Cluster:
  workers                           registered workers
  cluster                           counts of workers, GPUs and jobs
  drain WORKER                      send a worker no new work (lasts across restarts)
  undrain WORKER                    lift a drain

The controller is --controller or $RLHFD_CONTROLLER (default 127.0.0.1:50051). The token is read
from --token_file or $RLHFD_TOKEN_FILE (the controller's <state_dir>/token); --token and
$RLHFD_TOKEN give it directly (they show in `ps`). With TLS: --tls_ca=CA.pem, and for mTLS
--tls_cert=CERT.pem --tls_key=KEY.pem. Exit codes: 0 success, 1 refused or unreachable (the
message says why), 2 usage.
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
  const v1::JobProgress& progress = job.progress();
  if (progress.total_steps() > 0) {
    std::cout << "step:     " << progress.current_step() << " of " << progress.total_steps();
    if (progress.step_time_s() > 0) {
      std::cout << absl::StrFormat(" (%.2f s per step)", progress.step_time_s());
    }
    std::cout << "\n";
  }
  if (progress.checkpoint_step() > 0) {
    std::cout << "checkpoint: step " << progress.checkpoint_step() << " in "
              << job.spec().trainer().checkpoint_dir() << "\n";
  }
  for (const v1::RolePlacement& role : job.placement()) {
    std::cout << absl::StrFormat("%-9s %s\n", role.role() + ":",
                                 absl::StrJoin(role.worker_ids(), ", "));
  }
  if (progress.restarts() > 0) {
    std::cout << "restarts: " << progress.restarts() << "\n";
    for (const std::string& cause : progress.restart_causes()) std::cout << "  - " << cause << "\n";
  }
}

// The metrics a person follows a run by (all of them with --json).
constexpr const char* kKeyMetrics[] = {"critic/score/mean",    "actor/pg_loss",
                                       "actor/kl_loss",        "actor/entropy",
                                       "response_length/mean", "timing_s/step"};

std::string KeyMetrics(const google::protobuf::Map<std::string, double>& metrics) {
  std::vector<std::string> shown;
  for (const char* name : kKeyMetrics) {
    const auto found = metrics.find(name);
    if (found != metrics.end())
      shown.push_back(absl::StrCat(name, "=", FormatMetric(found->second, 4)));
  }
  for (const auto& [name, value] : metrics) {
    if (absl::StartsWith(name, "val"))
      shown.push_back(absl::StrCat(name, "=", FormatMetric(value, 4)));
  }
  return absl::StrJoin(shown, " ");
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
            << " draining, " << reply.workers_lost() << " lost; GPUs alive: " << reply.gpus_alive()
            << "\n";
  for (const auto& [state, count] : reply.jobs_by_state()) {
    const auto* value = v1::JobState_descriptor()->FindValueByName(state);
    std::cout << "jobs " << (value ? config::EnumConfigName(*value) : state) << ": " << count
              << "\n";
  }
  return kExitOk;
}

// A config file's text, or empty for "-" (a verl config given by overrides alone).
absl::StatusOr<std::string> ConfigText(const std::string& path, bool verl) {
  if (verl && path == "-") return std::string();
  auto text = ReadFileToString(path, 1 << 20);
  if (!text.ok()) return absl::Status(text.status().code(), text.status().message());
  return text;
}

void PrintConversionReport(const config::VerlConversion& conversion) {
  for (const std::string& warning : conversion.warnings)
    std::cerr << "warning: " << warning << "\n";
  for (const std::string& error : conversion.errors) std::cerr << "error: " << error << "\n";
}

// The rlhfd config text a submission sends: the file as it is, or the conversion of a verl
// config (the verl overrides are consumed by the conversion).
absl::StatusOr<std::string> SubmittedText(const std::string& path, bool from_verl,
                                          std::vector<std::string>* overrides) {
  ASSIGN_OR_RETURN(std::string text, ConfigText(path, from_verl));
  if (!from_verl) return text;
  ASSIGN_OR_RETURN(config::VerlConversion conversion,
                   config::ConvertVerlConfig(text, path, *overrides));
  PrintConversionReport(conversion);
  if (!conversion.errors.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", conversion.errors.size(),
        " verl settings are not supported (above); change them, or convert with `rlhfctl "
        "convert-verl` and edit the result"));
  }
  overrides->clear();
  return conversion.config.dump();
}

int Submit(Client& client, const std::string& path, bool from_verl,
           std::vector<std::string> overrides, std::string* job_id) {
  auto text = SubmittedText(path, from_verl, &overrides);
  if (!text.ok()) {
    std::cerr << "error: " << text.status().message() << "\n";
    return absl::IsInvalidArgument(text.status()) ? kExitFailed : kExitUsage;
  }
  v1::SubmitJobRequest request;
  request.set_config_text(*text);
  // A converted config is JSON; the name says where it came from.
  request.set_config_name(from_verl ? absl::StrCat(path == "-" ? "verl" : path, ".json") : path);
  for (const std::string& item : overrides) request.add_overrides(item);
  if (char cwd[4096]; ::getcwd(cwd, sizeof(cwd)) != nullptr) request.set_base_dir(cwd);
  grpc::ClientContext context;
  client.Prepare(&context);
  v1::SubmitJobReply reply;
  if (auto status = client.jobs().SubmitJob(&context, request, &reply); !status.ok()) {
    return Fail(status);
  }
  for (const std::string& warning : reply.warnings()) std::cerr << "warning: " << warning << "\n";
  *job_id = reply.job().job_id();
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << ToJson(reply) << "\n";
  } else {
    std::cout << "submitted " << reply.job().job_id() << " (" << reply.job().spec().name()
              << "): " << ShortEnum(v1::JobState_descriptor(), reply.job().state()) << "\n";
  }
  return kExitOk;
}

// Offline: the whole config as it will run, each value that came from a default or was derived
// marked so (with how it compares to verl's default), or every problem at once.
int Validate(const std::string& path, bool from_verl, std::vector<std::string> overrides) {
  auto text = SubmittedText(path, from_verl, &overrides);
  if (!text.ok()) {
    std::cerr << "error: " << text.status().message() << "\n";
    return absl::IsInvalidArgument(text.status()) ? kExitFailed : kExitUsage;
  }
  const std::string source = from_verl ? absl::StrCat(path, ".json") : path;
  auto loaded = config::LoadConfig(*text, source, overrides);
  if (loaded.ok()) {
    char cwd[4096];
    const std::string base_dir = ::getcwd(cwd, sizeof(cwd)) != nullptr ? cwd : "";
    if (absl::Status files = controller::ResolveAndCheckFiles(base_dir, source, &loaded->spec);
        !files.ok()) {
      loaded = files;
    }
  }
  if (!loaded.ok()) {
    std::cerr << "error: " << loaded.status().message() << "\n";
    return kExitFailed;
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << config::SpecToDocument(loaded->spec).dump(1) << "\n";
    return kExitOk;
  }
  const auto& notes = config::VerlDefaultNotes();
  std::cout << "# " << path << ": valid; " << loaded->defaulted.size() << " values from defaults, "
            << loaded->derived.size() << " derived\n";
  std::cout << config::ToYaml(config::SpecToDocument(loaded->spec), [&](const std::string& key) {
    std::string note;
    if (loaded->defaulted.count(key)) note = "(default)";
    if (loaded->derived.count(key)) note = "(derived)";
    if (!note.empty()) {
      if (auto it = notes.find(key); it != notes.end()) {
        note = absl::StrCat(note.substr(0, note.size() - 1), "; ", it->second, ")");
      }
    }
    return note;
  });
  return kExitOk;
}

int ConvertVerl(const std::string& path, const std::vector<std::string>& overrides) {
  auto text = ConfigText(path, /*verl=*/true);
  if (!text.ok()) {
    std::cerr << "error: " << text.status().message() << "\n";
    return kExitUsage;
  }
  auto conversion = config::ConvertVerlConfig(*text, path, overrides);
  if (!conversion.ok()) {
    std::cerr << "error: " << conversion.status().message() << "\n";
    return kExitFailed;
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << nlohmann::json{{"config", conversion->config},
                                {"mapped", conversion->mapped},
                                {"warnings", conversion->warnings},
                                {"errors", conversion->errors}}
                     .dump(1)
              << "\n";
  } else {
    std::cout << "# converted from " << (path == "-" ? "verl's defaults" : path)
              << "; check it with `rlhfctl validate`\n"
              << config::ToYaml(conversion->config);
    PrintConversionReport(*conversion);
  }
  return conversion->errors.empty() ? kExitOk : kExitFailed;
}

int Delete(Client& client, const std::string& job_id) {
  v1::DeleteJobRequest request;
  request.set_job_id(job_id);
  grpc::ClientContext context;
  client.Prepare(&context);
  v1::DeleteJobReply reply;
  if (auto status = client.jobs().DeleteJob(&context, request, &reply); !status.ok()) {
    return Fail(status);
  }
  std::cout << "deleted " << job_id << "\n";
  return kExitOk;
}

int Jobs(Client& client) {
  // The controller answers a page at a time; every page is fetched (each call with its own
  // deadline), so the table and --json hold every job.
  v1::ListJobsReply reply;
  v1::ListJobsRequest request;
  request.set_page_size(absl::GetFlag(FLAGS_page_size));
  do {
    grpc::ClientContext context;
    client.Prepare(&context);
    v1::ListJobsReply page;
    if (auto status = client.jobs().ListJobs(&context, request, &page); !status.ok()) {
      return Fail(status);
    }
    for (v1::Job& job : *page.mutable_jobs()) *reply.add_jobs() = std::move(job);
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << ToJson(reply) << "\n";
    return kExitOk;
  }
  Table table({"JOB", "NAME", "STATE", "GPUS", "SUBMITTED", "MESSAGE"});
  for (const v1::Job& job : reply.jobs()) {
    table.AddRow(
        {job.job_id(), job.spec().name(), ShortEnum(v1::JobState_descriptor(), job.state()),
         absl::StrCat(config::TotalGpus(job.spec())), Ago(job.submit_time_ms()), job.message()});
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
    if (event.step() > 0 || !event.metrics().empty()) std::cout << " step " << event.step();
    if (!event.metrics().empty()) std::cout << " " << KeyMetrics(event.metrics());
    if (!event.message().empty()) std::cout << " " << event.message();
    std::cout << std::endl;
  }
  if (grpc::Status status = reader->Finish(); !status.ok()) return Fail(status);
  return kExitOk;
}

bool Ended(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

absl::StatusOr<v1::Job> GetJob(Client& client, const std::string& job_id) {
  grpc::ClientContext context;
  client.Prepare(&context);
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::GetJobReply reply;
  if (auto status = client.jobs().GetJob(&context, request, &reply); !status.ok()) {
    return FromGrpcStatus(status);
  }
  return reply.job();
}

absl::StatusOr<v1::GetJobMetricsReply> GetMetrics(Client& client, const std::string& job_id,
                                                  int64_t after_step) {
  grpc::ClientContext context;
  client.Prepare(&context);
  v1::GetJobMetricsRequest request;
  request.set_job_id(job_id);
  request.set_after_step(after_step);
  v1::GetJobMetricsReply reply;
  if (auto status = client.jobs().GetJobMetrics(&context, request, &reply); !status.ok()) {
    return FromGrpcStatus(status);
  }
  return reply;
}

std::vector<std::string> MetricsRow(const v1::StepMetrics& step) {
  std::vector<std::string> row = {std::to_string(step.step())};
  for (const char* name : kKeyMetrics) {
    const auto found = step.metrics().find(name);
    row.push_back(found == step.metrics().end() ? "" : FormatMetric(found->second, 4));
  }
  return row;
}

int Metrics(Client& client, const std::string& job_id) {
  absl::StatusOr<v1::GetJobMetricsReply> reply = GetMetrics(client, job_id, 0);
  if (!reply.ok()) return Fail(ToGrpcStatus(reply.status()));
  const bool json = absl::GetFlag(FLAGS_json);
  if (json && !absl::GetFlag(FLAGS_follow)) {
    std::cout << ToJson(*reply) << "\n";
    return kExitOk;
  }
  std::vector<std::string> header = {"STEP"};
  for (const char* name : kKeyMetrics) header.emplace_back(name);
  int64_t last = -1;  // the last step printed (--follow asks again from it)
  const auto print = [&](const v1::GetJobMetricsReply& steps) {
    for (const v1::StepMetrics& step : steps.steps()) {
      if (step.step() <= last) continue;
      last = step.step();
      if (json) {
        std::cout << ToJson(step) << std::endl;
      } else {
        std::cout << absl::StrJoin(MetricsRow(step), "  ") << std::endl;
      }
    }
  };
  if (!absl::GetFlag(FLAGS_follow)) {
    Table table(header);
    for (const v1::StepMetrics& step : reply->steps()) table.AddRow(MetricsRow(step));
    table.Print(std::cout);
    return kExitOk;
  }
  // --follow: each step as a line once it is recorded, until the job ends.
  if (!json) std::cout << absl::StrJoin(header, "  ") << std::endl;
  while (true) {
    print(*reply);
    absl::StatusOr<v1::Job> job = GetJob(client, job_id);
    if (!job.ok()) return Fail(ToGrpcStatus(job.status()));
    if (Ended(job->state())) {
      // Steps recorded between the last poll and the end.
      reply = GetMetrics(client, job_id, std::max<int64_t>(last, 0));
      if (reply.ok()) print(*reply);
      return kExitOk;
    }
    absl::SleepFor(absl::Seconds(1));
    reply = GetMetrics(client, job_id, std::max<int64_t>(last, 0));
    if (!reply.ok()) return Fail(ToGrpcStatus(reply.status()));
  }
}

// submit --wait: the job's progress until it ends; the exit code is its outcome.
int Wait(Client& client, const std::string& job_id) {
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  grpc::ClientContext context;
  client.Prepare(&context, /*with_deadline=*/false);
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader =
      client.jobs().WatchJob(&context, request);
  const bool terminal = ::isatty(STDOUT_FILENO) == 1;
  v1::JobState state = v1::JOB_STATE_QUEUED;
  std::string message;
  int64_t total = 0;
  absl::Time running_since = absl::InfinitePast();
  int64_t first_step = 0;
  v1::JobEvent event;
  while (reader->Read(&event)) {
    if (event.step() == 0 && event.metrics().empty()) {
      state = event.state();
      message = event.message();
      if (terminal) std::cout << "\n";
      std::cout << ShortEnum(v1::JobState_descriptor(), state) << ": " << message << std::endl;
      if (state == v1::JOB_STATE_RUNNING) {
        absl::StatusOr<v1::Job> job = GetJob(client, job_id);
        if (job.ok()) {
          total = job->progress().total_steps();
          first_step = job->progress().current_step();
        }
        running_since = absl::Now();
      }
      if (Ended(state)) break;
      continue;
    }
    if (event.step() == 0) continue;  // validation before training
    if (total == 0) {
      // The record has the run's length once its first step is in.
      absl::StatusOr<v1::Job> job = GetJob(client, job_id);
      if (job.ok()) total = job->progress().total_steps();
    }
    // The ETA from the pace since this run started (resumed runs count from where they began).
    std::string eta = "?";
    const int64_t done = event.step() - first_step;
    if (total > 0 && done > 0 && running_since != absl::InfinitePast()) {
      const absl::Duration per_step = (absl::Now() - running_since) / done;
      eta = absl::FormatDuration(absl::Trunc(per_step * (total - event.step()), absl::Seconds(1)));
    }
    const int width = 30;
    const int filled = total > 0 ? static_cast<int>(width * event.step() / total) : 0;
    const auto reward = event.metrics().find("critic/score/mean");
    const std::string line =
        absl::StrFormat("[%s%s] step %d/%d  ETA %s  reward %s", std::string(filled, '#'),
                        std::string(width - std::min(width, filled), '.'), event.step(), total, eta,
                        reward == event.metrics().end() ? "-" : FormatMetric(reward->second, 4));
    if (terminal) {
      std::cout << "\r" << line << std::flush;
    } else {
      std::cout << line << std::endl;
    }
  }
  if (grpc::Status status = reader->Finish(); !status.ok() && !Ended(state)) return Fail(status);
  return state == v1::JOB_STATE_SUCCEEDED ? kExitOk : kExitFailed;
}

// export: the actor of a checkpoint, as the driver exported it, copied to --out.
int Export(Client& client, const std::string& job_id) {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::cerr << "usage: rlhfctl export JOB --out DIR [--step N]\n";
    return kExitUsage;
  }
  absl::StatusOr<v1::Job> job = GetJob(client, job_id);
  if (!job.ok()) return Fail(ToGrpcStatus(job.status()));
  const std::string& checkpoints = job->spec().trainer().checkpoint_dir();
  const int64_t step =
      absl::GetFlag(FLAGS_step) > 0 ? absl::GetFlag(FLAGS_step) : job->progress().checkpoint_step();
  if (checkpoints.empty() || step <= 0) {
    std::cerr << "error: " << job_id << " has no checkpoint"
              << (checkpoints.empty() ? " (trainer.checkpoint_dir is not set)" : " yet") << "\n";
    return kExitFailed;
  }
  const std::string step_dir = absl::StrCat(checkpoints, "/step_", step);
  const std::string source = step_dir + "/actor/huggingface";
  std::error_code error;
  if (std::filesystem::is_directory(source, error)) {
    std::filesystem::create_directories(out, error);
    std::filesystem::copy(source, out,
                          std::filesystem::copy_options::recursive |
                              std::filesystem::copy_options::overwrite_existing,
                          error);
    if (error) {
      std::cerr << "error: copying " << source << " to " << out << ": " << error.message() << "\n";
      return kExitFailed;
    }
    std::cout << "exported " << job_id << " step " << step << " to " << out << "\n";
    return kExitOk;
  }
  if (!std::filesystem::is_directory(step_dir, error)) {
    std::cerr << "error: " << step_dir << " is not readable here: run export where "
              << "trainer.checkpoint_dir is mounted\n";
  } else {
    std::cerr << "error: step " << step << " of " << job_id
              << " was saved without a Hugging Face export (the driver exports the last step); "
                 "give --step of the last one\n";
  }
  return kExitFailed;
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

int Run(const std::vector<char*>& args, bool from_verl) {
  // Command → (arguments it takes; whether key=value overrides may follow).
  struct Shape {
    size_t arguments;
    bool overrides;
  };
  static const std::map<std::string, Shape> kCommands = {
      {"workers", {0, false}}, {"cluster", {0, false}}, {"jobs", {0, false}},
      {"submit", {1, true}},   {"validate", {1, true}}, {"convert-verl", {1, true}},
      {"status", {1, false}},  {"cancel", {1, false}},  {"delete", {1, false}},
      {"watch", {1, false}},   {"drain", {1, false}},   {"undrain", {1, false}},
      {"metrics", {1, false}}, {"export", {1, false}}};
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
  const Shape shape = known->second;
  if (args.size() < 2 + shape.arguments ||
      (!shape.overrides && args.size() != 2 + shape.arguments)) {
    std::cerr << "usage: rlhfctl " << command << (shape.arguments ? " ARG" : "")
              << (shape.overrides ? " [key=value ...]" : "") << "\n";
    return kExitUsage;
  }
  if (from_verl && command != "submit" && command != "validate") {
    std::cerr << "--from-verl goes with submit and validate\n";
    return kExitUsage;
  }
  const std::vector<std::string> overrides(args.begin() + 2 + std::min<size_t>(shape.arguments, 1),
                                           args.end());
  // Offline commands need no controller.
  if (command == "validate") return Validate(args[2], from_verl, overrides);
  if (command == "convert-verl") return ConvertVerl(args[2], overrides);
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
  if (command == "submit") {
    std::string job_id;
    const int submitted = Submit(client, args[2], from_verl, overrides, &job_id);
    if (submitted != kExitOk || !absl::GetFlag(FLAGS_wait)) return submitted;
    return Wait(client, job_id);
  }
  if (command == "status") return Status(client, args[2]);
  if (command == "cancel") return Cancel(client, args[2]);
  if (command == "delete") return Delete(client, args[2]);
  if (command == "watch") return Watch(client, args[2]);
  if (command == "metrics") return Metrics(client, args[2]);
  if (command == "export") return Export(client, args[2]);
  return SetDrained(client, args[2], /*drained=*/command == "drain");
}

}  // namespace
}  // namespace rlhfd::cli

int main(int argc, char** argv) {
  rlhfd::HandleHelp(argc, argv, rlhfd::cli::kUsage);
  // --from-verl is spelled as verl users type it, which Abseil flag names cannot be.
  bool from_verl = false;
  std::vector<char*> kept;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--from-verl" || std::string(argv[i]) == "--from_verl") {
      from_verl = true;
    } else {
      kept.push_back(argv[i]);
    }
  }
  absl::SetProgramUsageMessage(rlhfd::cli::kUsage);
  std::vector<char*> args = absl::ParseCommandLine(static_cast<int>(kept.size()), kept.data());
  return rlhfd::cli::Run(args, from_verl);
}
