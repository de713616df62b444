// JobManager and Controller: submission, validation, persistence across restarts, cancellation
// and events, driven directly (no RPC).
#include <catch2/catch.hpp>
#include <sys/stat.h>


#include "common/util/files.h"
#include "controller/controller.h"
#include "tests/support/subprocess.h"

namespace rlhfd::controller {
namespace {

const std::string kFixtures = RLHFD_FIXTURES_DIR;

// An example config, its model and data pointed at the fixtures (the controller checks that they
// exist).
v1::SubmitJobRequest FromFile(const std::string& name) {
  const std::string path = std::string(RLHFD_CONFIGS_DIR) + "/" + name;
  auto text = ReadFileToString(path);
  REQUIRE(text.ok());
  v1::SubmitJobRequest request;
  request.set_config_text(*text);
  request.set_config_name(name);
  request.add_overrides("model.path=" + kFixtures + "/models/tiny-qwen2");
  request.add_overrides("data.train_files=[" + kFixtures + "/data/arithmetic_train.jsonl]");
  request.add_overrides("data.val_files=[" + kFixtures + "/data/arithmetic_train.jsonl]");
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

TEST_CASE("job ids are never reused, whatever happens to the files", "[jobs]") {
  testing::TempDir dir;
  int64_t now = 0;
  auto controller = MakeController(dir.path(), &now);
  REQUIRE(controller->SubmitJob(FromFile("tiny-cpu-demo.yaml"))->job().job_id() == "job-1");
  REQUIRE(controller->SubmitJob(FromFile("tiny-cpu-demo.yaml"))->job().job_id() == "job-2");
  REQUIRE(controller->SubmitJob(FromFile("tiny-cpu-demo.yaml"))->job().job_id() == "job-3");
  controller.reset();
  const std::string jobs = dir.path() + "/jobs";
  // job-3 is torn, job-2 grew past what the loader reads, job-1 vanished.
  REQUIRE(WriteFileAtomically(jobs + "/job-3.json", "{\"job_id\": \"job-3\", ").ok());
  REQUIRE(WriteFileAtomically(jobs + "/job-2.json", std::string(9 << 20, ' ')).ok());
  REQUIRE(RemoveTree(jobs + "/job-1.json").ok());
  // And a crash left a temporary file behind.
  REQUIRE(WriteFileAtomically(jobs + "/.job-4.json.tmp.AbC123", "partial").ok());

  auto restarted = MakeController(dir.path(), &now);
  CHECK(restarted->ListJobs({})->jobs_size() == 0);
  CHECK(PathExists(jobs + "/job-3.json.corrupt"));
  CHECK(PathExists(jobs + "/job-2.json.corrupt"));
  CHECK_FALSE(PathExists(jobs + "/.job-4.json.tmp.AbC123"));
  CHECK(restarted->SubmitJob(FromFile("tiny-cpu-demo.yaml"))->job().job_id() == "job-4");

  // Without the counter file, the highest file name (corrupt ones too) still counts.
  restarted.reset();
  REQUIRE(RemoveTree(jobs + "/next_job_number").ok());
  REQUIRE(RemoveTree(jobs + "/job-4.json").ok());
  REQUIRE(WriteFileAtomically(jobs + "/job-9.json.corrupt", "x").ok());
  auto again = MakeController(dir.path(), &now);
  CHECK(again->SubmitJob(FromFile("tiny-cpu-demo.yaml"))->job().job_id() == "job-10");
}

TEST_CASE("only canonical job ids name a job", "[jobs]") {
  testing::TempDir dir;
  int64_t now = 0;
  auto controller = MakeController(dir.path(), &now);
  REQUIRE(controller->SubmitJob(FromFile("tiny-cpu-demo.yaml")).ok());
  v1::GetJobRequest get;
  get.set_job_id("job-1");
  CHECK(controller->GetJob(get).ok());
  for (const char* alias : {"job-01", "job-+1", "job- 1", "job-1\n", "job-1 ", "JOB-1", "job-1.0",
                            "job-", "job-0", "job-99999999999999999999", "1"}) {
    INFO(alias);
    get.set_job_id(alias);
    CHECK(absl::IsNotFound(controller->GetJob(get).status()));
  }
}

TEST_CASE("submission fields are bounded before anything is stored", "[jobs]") {
  testing::TempDir dir;
  int64_t now = 0;
  auto controller = MakeController(dir.path(), &now);
  v1::SubmitJobRequest request = FromFile("tiny-cpu-demo.yaml");
  request.set_config_name(std::string(70 << 20, 'n'));
  auto refused = controller->SubmitJob(request);
  CHECK(absl::IsInvalidArgument(refused.status()));
  CHECK(refused.status().message().size() < 500);
  request.set_config_name("evil\x1b[2J.yaml");
  CHECK(absl::IsInvalidArgument(controller->SubmitJob(request).status()));
  CHECK(controller->ListJobs({})->jobs_size() == 0);
}

TEST_CASE("the state directory is private", "[jobs]") {
  testing::TempDir dir;
  const std::string state = dir.path() + "/state";
  REQUIRE(MakeDirectories(state, 0755).ok());
  int64_t now = 0;
  auto controller = MakeController(state, &now);
  struct stat st;
  REQUIRE(::stat(state.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
}

TEST_CASE("a drain survives a controller restart until it is lifted", "[jobs]") {
  testing::TempDir dir;
  int64_t now = 0;
  v1::RegisterWorkerRequest worker;
  worker.set_worker_id("w0");
  worker.set_address("h:1");
  worker.set_instance_id("i0");
  worker.mutable_capacity()->set_device_kind(v1::DEVICE_KIND_CPU);
  worker.mutable_capacity()->set_device_index(-1);
  v1::DrainWorkerRequest drain;
  drain.set_worker_id("w0");
  v1::UndrainWorkerRequest undrain;
  undrain.set_worker_id("w0");
  {
    auto controller = MakeController(dir.path(), &now);
    REQUIRE(controller->RegisterWorker(worker).ok());
    REQUIRE(controller->DrainWorker(drain).ok());
  }
  {
    auto controller = MakeController(dir.path(), &now);
    REQUIRE(controller->RegisterWorker(worker).ok());
    CHECK(controller->ListWorkers({})->workers(0).state() == v1::WORKER_STATE_DRAINING);
    auto lifted = controller->UndrainWorker(undrain);
    REQUIRE(lifted.ok());
    CHECK(lifted->worker().state() == v1::WORKER_STATE_ALIVE);
    CHECK(absl::IsNotFound(controller->UndrainWorker(undrain).status()));
  }
  auto controller = MakeController(dir.path(), &now);
  REQUIRE(controller->RegisterWorker(worker).ok());
  CHECK(controller->ListWorkers({})->workers(0).state() == v1::WORKER_STATE_ALIVE);
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
