// JobManager and Controller: submission, validation, persistence across restarts, cancellation
// and events, driven directly (no RPC).
#include <catch2/catch.hpp>


#include "common/util/files.h"
#include "controller/controller.h"
#include "tests/support/subprocess.h"

namespace rlhfd::controller {
namespace {

v1::SubmitJobRequest FromFile(const std::string& name) {
  const std::string path = std::string(RLHFD_CONFIGS_DIR) + "/" + name;
  auto text = ReadFileToString(path);
  REQUIRE(text.ok());
  v1::SubmitJobRequest request;
  request.set_config_text(*text);
  request.set_config_name(name);
  return request;
}

std::unique_ptr<Controller> MakeController(const std::string& state_dir, int64_t* now) {
  ControllerOptions options;
  options.state_dir = state_dir;
  auto controller = Controller::Create(options, [now] { return *now; });
  REQUIRE(controller.ok());
  return *std::move(controller);
}

}  // namespace

TEST_CASE("jobs are queued, listed, cancelled and survive a restart", "[jobs]") {
  testing::TempDir dir;
  int64_t now = 1000;
  auto controller = MakeController(dir.path(), &now);

  auto first = controller->SubmitJob(FromFile("grpo-gsm8k-qwen05b.yaml"));
  REQUIRE(first.ok());
  CHECK(first->job().job_id() == "job-1");
  CHECK(first->job().state() == v1::JOB_STATE_QUEUED);
  CHECK(first->job().source() == "grpo-gsm8k-qwen05b.yaml");
  CHECK(first->job().spec().roles().actor().train().dp() == 4);
  now = 2000;
  auto second = controller->SubmitJob(FromFile("ppo-gsm8k-qwen05b.yaml"));
  REQUIRE(second.ok());
  CHECK(second->job().job_id() == "job-2");

  v1::CancelJobRequest cancel;
  cancel.set_job_id("job-1");
  auto cancelled = controller->CancelJob(cancel);
  REQUIRE(cancelled.ok());
  CHECK(cancelled->job().state() == v1::JOB_STATE_CANCELLED);
  CHECK(absl::IsFailedPrecondition(controller->CancelJob(cancel).status()));

  v1::ListJobsRequest queued_only;
  queued_only.add_states(v1::JOB_STATE_QUEUED);
  CHECK(controller->ListJobs(queued_only)->jobs_size() == 1);

  // A new controller over the same state directory sees the same jobs and continues numbering.
  controller.reset();
  auto restarted = MakeController(dir.path(), &now);
  auto listed = restarted->ListJobs({});
  REQUIRE(listed.ok());
  REQUIRE(listed->jobs_size() == 2);
  CHECK(listed->jobs(0).state() == v1::JOB_STATE_CANCELLED);
  CHECK(listed->jobs(1).state() == v1::JOB_STATE_QUEUED);
  CHECK(listed->jobs(1).spec().SerializeAsString() == second->job().spec().SerializeAsString());
  auto third = restarted->SubmitJob(FromFile("rloo-colocated.json"));
  REQUIRE(third.ok());
  CHECK(third->job().job_id() == "job-3");
}

TEST_CASE("an invalid config creates no job", "[jobs]") {
  testing::TempDir dir;
  int64_t now = 0;
  auto controller = MakeController(dir.path(), &now);
  v1::SubmitJobRequest request;
  request.set_config_text("name: broken\nmodel: {path: /m}\nroles: {actor: {gpus: -1}}\n");
  request.set_config_name("broken.yaml");
  auto refused = controller->SubmitJob(request);
  REQUIRE_FALSE(refused.ok());
  CHECK(absl::IsInvalidArgument(refused.status()));
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("broken.yaml"));
  CHECK(controller->ListJobs({})->jobs_size() == 0);
  CHECK(absl::IsInvalidArgument(controller->SubmitJob({}).status()));
  v1::GetJobRequest get;
  get.set_job_id("job-1");
  CHECK(absl::IsNotFound(controller->GetJob(get).status()));
}

TEST_CASE("a corrupt job file is set aside, not fatal", "[jobs]") {
  testing::TempDir dir;
  int64_t now = 0;
  REQUIRE(MakeDirectories(dir.path() + "/jobs").ok());
  REQUIRE(WriteFileAtomically(dir.path() + "/jobs/job-7.json", "{ not json").ok());
  auto controller = MakeController(dir.path(), &now);
  CHECK(controller->ListJobs({})->jobs_size() == 0);
  CHECK(PathExists(dir.path() + "/jobs/job-7.json.corrupt"));
}

TEST_CASE("watchers get the current state and every transition", "[jobs]") {
  testing::TempDir dir;
  int64_t now = 0;
  auto controller = MakeController(dir.path(), &now);
  REQUIRE(controller->SubmitJob(FromFile("tiny-cpu-demo.yaml")).ok());
  std::vector<v1::JobEvent> events;
  v1::WatchJobRequest watch;
  watch.set_job_id("job-1");
  auto subscription =
      controller->WatchJob(watch, [&](const v1::JobEvent& event) { events.push_back(event); });
  REQUIRE(subscription.ok());
  REQUIRE(events.size() == 1);
  CHECK(events[0].state() == v1::JOB_STATE_QUEUED);
  v1::CancelJobRequest cancel;
  cancel.set_job_id("job-1");
  REQUIRE(controller->CancelJob(cancel).ok());
  REQUIRE(events.size() == 2);
  CHECK(events[1].state() == v1::JOB_STATE_CANCELLED);
  controller->UnwatchJob(*subscription);
  watch.set_job_id("job-99");
  CHECK(absl::IsNotFound(controller->WatchJob(watch, [](const v1::JobEvent&) {}).status()));
}

TEST_CASE("cluster summary counts workers and jobs", "[jobs]") {
  testing::TempDir dir;
  int64_t now = 0;
  auto controller = MakeController(dir.path(), &now);
  v1::RegisterWorkerRequest gpu;
  gpu.set_worker_id("gpu0");
  gpu.set_address("h:1");
  gpu.mutable_capacity()->set_device_kind(v1::DEVICE_KIND_CUDA);
  gpu.mutable_capacity()->set_compute_capability("9.0");
  REQUIRE(controller->RegisterWorker(gpu).ok());
  REQUIRE(controller->SubmitJob(FromFile("tiny-cpu-demo.yaml")).ok());
  auto cluster = controller->GetCluster({});
  REQUIRE(cluster.ok());
  CHECK(cluster->workers_alive() == 1);
  CHECK(cluster->gpus_alive() == 1);
  CHECK(cluster->jobs_by_state().at("JOB_STATE_QUEUED") == 1);
  now = 60'000;
  controller->SweepLiveness();
  CHECK(controller->GetCluster({})->workers_lost() == 1);
}

TEST_CASE("controller options are checked", "[jobs]") {
  ControllerOptions options;
  CHECK(absl::IsInvalidArgument(Controller::Create(options, [] { return 0; }).status()));
  options.state_dir = "/tmp/x";
  options.liveness.liveness_window = absl::Seconds(1);
  options.liveness.heartbeat_interval = absl::Seconds(2);
  CHECK(absl::IsInvalidArgument(Controller::Create(options, [] { return 0; }).status()));
}

}  // namespace rlhfd::controller
