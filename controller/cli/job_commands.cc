// rlhfctl jobs, status, cancel, delete, watch, metrics, submit --wait and export.
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/config/job_validator.h"
#include "common/jobs/job_states.h"
#include "common/rpc/grpc_status.h"
#include "common/util/metric_value.h"
#include "controller/cli/cli_flags.h"
#include "controller/cli/commands.h"
#include "controller/cli/printing.h"
#include "controller/cli/table.h"

namespace rlhfd::cli {

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
    if (IsTerminal(job->state())) {
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
      if (IsTerminal(state)) break;
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
  if (grpc::Status status = reader->Finish(); !status.ok() && !IsTerminal(state))
    return Fail(status);
  return state == v1::JOB_STATE_SUCCEEDED ? kExitOk : kExitFailed;
}

int Export(Client& client, const std::string& job_id) {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::cerr << "usage: rlhfctl export JOB --out DIR [--step N] [--merged]\n";
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
  // A LoRA job's adapter is the product (PEFT loads it over the base); --merged asks for the
  // whole model instead.
  const v1::ModelSpec& model = job->spec().model();
  const bool adapter =
      (model.lora_rank() > 0 || !model.lora_adapter_path().empty()) && !absl::GetFlag(FLAGS_merged);
  const std::string source = step_dir + (adapter ? "/actor/lora_adapter" : "/actor/huggingface");
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
    std::cout << "exported " << job_id << " step " << step
              << (adapter ? " (its PEFT adapter; --merged for the merged model)" : "") << " to "
              << out << "\n";
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

}  // namespace rlhfd::cli
