// JobManager and Controller: submission, validation, persistence across restarts, cancellation
// and events, driven directly (no RPC).
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/util/files.h"
#include "controller/controller.h"
#include "controller/jobs/submit_checks.h"
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

// A CPU worker's registration, at a made-up address.
v1::RegisterWorkerRequest CpuWorker(const std::string& id) {
  v1::RegisterWorkerRequest worker;
  worker.set_worker_id(id);
  worker.set_address("h:1");
  worker.set_instance_id("i0");
  worker.mutable_capacity()->set_device_kind(v1::DEVICE_KIND_CPU);
  worker.mutable_capacity()->set_device_index(-1);
  return worker;
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

TEST_CASE(
    "a tool config and a LoRA adapter directory are checked at submission, relative to "
    "base_dir",
    "[jobs]") {
  testing::TempDir dir;
  int64_t now = 0;
  auto controller = MakeController(dir.path(), &now);
  std::filesystem::create_directories(dir.path() + "/adapter");
  std::ofstream(dir.path() + "/tools.yaml") << "tools: []\n";
  const auto submit = [&](const std::string& override_text) {
    v1::SubmitJobRequest request = FromFile("tiny-cpu-demo.yaml");
    request.set_base_dir(dir.path());
    request.add_overrides("model.path=" + kFixtures + "/models/tiny-qwen2");
    request.add_overrides("data.train_files=[" + kFixtures + "/data/arithmetic_train.jsonl]");
    request.add_overrides(override_text);
    return controller->SubmitJob(request);
  };
  const auto tools =
      submit("roles.actor.rollout.multi_turn={enable: true, tool_config_path: tools.yaml}");
  INFO(tools.status());
  REQUIRE(tools.ok());
  CHECK(tools->job().spec().roles().actor().rollout().multi_turn().tool_config_path() ==
        dir.path() + "/tools.yaml");
  CHECK_THAT(
      std::string(
          submit("roles.actor.rollout.multi_turn={enable: true, tool_config_path: absent.yaml}")
              .status()
              .message()),
      Catch::Contains("roles.actor.rollout.multi_turn.tool_config_path: the tool config '" +
                      dir.path() + "/absent.yaml' not found"));
  CHECK_THAT(std::string(submit("model.lora_adapter_path=adapter").status().message()),
             Catch::Contains("model.lora_adapter_path: '" + dir.path() +
                             "/adapter' is not a PEFT adapter directory: no adapter_config.json"));
  std::ofstream(dir.path() + "/adapter/adapter_config.json") << "{}";
  const auto adapter = submit("model.lora_adapter_path=adapter");
  INFO(adapter.status());
  REQUIRE(adapter.ok());
  CHECK(adapter->job().spec().model().lora_adapter_path() == dir.path() + "/adapter");
}

TEST_CASE("a Python reward function's file is checked at submission, relative to base_dir",
          "[jobs]") {
  testing::TempDir dir;
  int64_t now = 0;
  auto controller = MakeController(dir.path(), &now);
  const auto submit = [&](const std::string& path, const std::string& name) {
    v1::SubmitJobRequest request = FromFile("tiny-cpu-demo.yaml");
    request.set_base_dir(kFixtures);
    request.add_overrides("~roles.reward.rule");
    request.add_overrides("roles.reward.custom_reward_function.path=" + path);
    request.add_overrides("+roles.reward.custom_reward_function.reward_kwargs={scale: 2, tag: a}");
    if (!name.empty()) request.add_overrides("roles.reward.custom_reward_function.name=" + name);
    return controller->SubmitJob(request);
  };
  // Relative to the submitting directory; the default name, compute_score, is in the file.
  const auto accepted = submit("python_rewards/verl_docs_reward.py", "");
  INFO(accepted.status());
  REQUIRE(accepted.ok());
  CHECK(accepted->job().spec().roles().reward().custom_reward_function().path() ==
        kFixtures + "/python_rewards/verl_docs_reward.py");
  CHECK(submit("python_rewards/verl_docs_reward.py", "my_reward_fn").ok());
  const auto missing = submit("python_rewards/absent.py", "");
  CHECK_THAT(std::string(missing.status().message()),
             Catch::Contains("roles.reward.custom_reward_function.path") &&
                 Catch::Contains("python_rewards/absent.py"));
  const auto unnamed = submit("python_rewards/verl_docs_reward.py", "score_it");
  CHECK_THAT(std::string(unnamed.status().message()),
             Catch::Contains("roles.reward.custom_reward_function.name: 'score_it' is not "
                             "defined in"));
  // A prefix of a name is not the name.
  CHECK_FALSE(submit("python_rewards/verl_docs_reward.py", "compute").ok());
  // reward_kwargs (a google.protobuf.Struct) survive the job store and a restart.
  const auto& kwargs =
      accepted->job().spec().roles().reward().custom_reward_function().reward_kwargs();
  CHECK(kwargs.fields().at("scale").number_value() == 2);
  CHECK(kwargs.fields().at("tag").string_value() == "a");
  controller.reset();
  auto restarted = MakeController(dir.path(), &now);
  v1::GetJobRequest get;
  get.set_job_id(accepted->job().job_id());
  const auto reread = restarted->GetJob(get);
  REQUIRE(reread.ok());
  // (Compared field by field: a Struct is a map, whose serialized order is not fixed.)
  CHECK(google::protobuf::util::MessageDifferencer::Equals(reread->job().spec(),
                                                           accepted->job().spec()));
}

TEST_CASE("a job file of the older store is imported, a corrupt one set aside", "[jobs]") {
  testing::TempDir dir;
  int64_t now = 0;
  {
    // A job as the JSON file store wrote it.
    auto controller = MakeController(dir.path() + "/first", &now);
    REQUIRE(controller->SubmitJob(FromFile("tiny-cpu-demo.yaml")).ok());
    v1::GetJobRequest get;
    get.set_job_id("job-1");
    std::string json;
    REQUIRE(
        google::protobuf::util::MessageToJsonString(controller->GetJob(get)->job(), &json).ok());
    REQUIRE(MakeDirectories(dir.path() + "/jobs").ok());
    REQUIRE(WriteFileAtomically(dir.path() + "/jobs/job-5.json",
                                absl::StrReplaceAll(json, {{"job-1", "job-5"}}))
                .ok());
  }
  REQUIRE(WriteFileAtomically(dir.path() + "/jobs/job-7.json", "{ not json").ok());
  REQUIRE(WriteFileAtomically(dir.path() + "/jobs/.job-8.json.tmp.AbC123", "partial").ok());
  {
    auto controller = MakeController(dir.path(), &now);
    auto listed = controller->ListJobs({});
    REQUIRE(listed.ok());
    REQUIRE(listed->jobs_size() == 1);
    CHECK(listed->jobs(0).job_id() == "job-5");
    CHECK(listed->jobs(0).spec().name() == "tiny-cpu-demo");
    CHECK(PathExists(dir.path() + "/jobs/job-7.json.corrupt"));
    CHECK_FALSE(PathExists(dir.path() + "/jobs/job-5.json"));  // now a row of jobs.db
    CHECK_FALSE(PathExists(dir.path() + "/jobs/.job-8.json.tmp.AbC123"));
    // Numbering continues above every file, the corrupt one included.
    CHECK(controller->SubmitJob(FromFile("tiny-cpu-demo.yaml"))->job().job_id() == "job-8");
  }
  // The import happened once: the job keeps its row and its state.
  auto again = MakeController(dir.path(), &now);
  CHECK(again->ListJobs({})->jobs_size() == 2);
}

// Runs one statement on the controller's job database, as a disk fault or a person might.
void ExecuteOnJobStore(const std::string& state_dir, const std::string& sql) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open((state_dir + "/jobs.db").c_str(), &db) == SQLITE_OK);
  char* error = nullptr;
  const int result = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  INFO((error ? error : ""));
  sqlite3_free(error);
  sqlite3_close(db);
  REQUIRE(result == SQLITE_OK);
}

TEST_CASE("job ids are never reused, whatever happens to the records", "[jobs]") {
  testing::TempDir dir;
  int64_t now = 0;
  auto controller = MakeController(dir.path(), &now);
  for (int i = 1; i <= 3; ++i) {
    REQUIRE(controller->SubmitJob(FromFile("tiny-cpu-demo.yaml"))->job().job_id() ==
            absl::StrCat("job-", i));
  }
  // The newest job deleted: its number stays used.
  v1::CancelJobRequest cancel;
  cancel.set_job_id("job-3");
  REQUIRE(controller->CancelJob(cancel).ok());
  v1::DeleteJobRequest remove;
  remove.set_job_id("job-3");
  REQUIRE(controller->DeleteJob(remove).ok());
  controller.reset();
  // job-2's record is torn.
  ExecuteOnJobStore(dir.path(), "UPDATE jobs SET record = x'0a05' WHERE number = 2");
  auto restarted = MakeController(dir.path(), &now);
  auto listed = restarted->ListJobs({});
  REQUIRE(listed.ok());
  REQUIRE(listed->jobs_size() == 1);  // job-2 is set aside, not fatal
  CHECK(listed->jobs(0).job_id() == "job-1");
  CHECK(restarted->SubmitJob(FromFile("tiny-cpu-demo.yaml"))->job().job_id() == "job-4");

  // Without the counter, the highest row (a set-aside one too) still counts.
  restarted.reset();
  ExecuteOnJobStore(dir.path(),
                    "DELETE FROM counters; DELETE FROM jobs WHERE number = 4;"
                    "UPDATE corrupt_jobs SET number = 9 WHERE number = 2");
  auto again = MakeController(dir.path(), &now);
  CHECK(again->SubmitJob(FromFile("tiny-cpu-demo.yaml"))->job().job_id() == "job-10");
}

TEST_CASE("ListJobs pages: each job once, bounded pages, checked tokens", "[jobs]") {
  testing::TempDir dir;
  int64_t now = 0;
  auto controller = MakeController(dir.path(), &now);
  constexpr int kJobs = 105;
  for (int i = 0; i < kJobs; ++i)
    REQUIRE(controller->SubmitJob(FromFile("tiny-cpu-demo.yaml")).ok());
  v1::CancelJobRequest cancel;
  cancel.set_job_id("job-2");
  REQUIRE(controller->CancelJob(cancel).ok());

  // The default page is 100 jobs.
  auto first = controller->ListJobs({});
  REQUIRE(first.ok());
  CHECK(first->jobs_size() == 100);
  CHECK_FALSE(first->next_page_token().empty());

  // Pages of 10, in states: every queued job once, in order, and the last page has no token.
  v1::ListJobsRequest request;
  request.add_states(v1::JOB_STATE_QUEUED);
  request.set_page_size(10);
  std::vector<std::string> seen;
  int pages = 0;
  do {
    auto page = controller->ListJobs(request);
    REQUIRE(page.ok());
    CHECK(page->jobs_size() <= 10);
    for (const v1::Job& job : page->jobs()) seen.push_back(job.job_id());
    request.set_page_token(page->next_page_token());
    REQUIRE(++pages <= 20);
  } while (!request.page_token().empty());
  REQUIRE(seen.size() == kJobs - 1);
  for (size_t i = 0; i < seen.size(); ++i) {
    CHECK(seen[i] == absl::StrCat("job-", i < 1 ? i + 1 : i + 2));
  }

  // A token made for other states, a forged one, a negative page size: INVALID_ARGUMENT that
  // names the field.
  v1::ListJobsRequest queued;
  queued.add_states(v1::JOB_STATE_QUEUED);
  queued.set_page_size(10);
  auto queued_page = controller->ListJobs(queued);
  REQUIRE(queued_page.ok());
  v1::ListJobsRequest other_states;
  other_states.set_page_token(queued_page->next_page_token());
  auto refused = controller->ListJobs(other_states);
  CHECK(absl::IsInvalidArgument(refused.status()));
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("page_token"));
  for (const char* forged : {"x", "%%%", "cDEuNS43", "cDEuLTEuMA", "cDIuNS4w", "cDEuNQ"}) {
    INFO(forged);
    v1::ListJobsRequest bad;
    bad.set_page_token(forged);
    CHECK(absl::IsInvalidArgument(controller->ListJobs(bad).status()));
  }
  v1::ListJobsRequest negative;
  negative.set_page_size(-1);
  CHECK(absl::IsInvalidArgument(controller->ListJobs(negative).status()));
  v1::ListJobsRequest huge;
  huge.set_page_size(1 << 30);
  CHECK(controller->ListJobs(huge)->jobs_size() == kJobs);  // lowered to 1000
}

TEST_CASE("same-name warnings stay short however many jobs share the name", "[jobs]") {
  testing::TempDir dir;
  int64_t now = 0;
  auto controller = MakeController(dir.path(), &now);
  for (int i = 0; i < 5; ++i) REQUIRE(controller->SubmitJob(FromFile("tiny-cpu-demo.yaml")).ok());
  v1::CancelJobRequest cancel;
  cancel.set_job_id("job-1");
  REQUIRE(controller->CancelJob(cancel).ok());  // ended: no longer named
  auto sixth = controller->SubmitJob(FromFile("tiny-cpu-demo.yaml"));
  REQUIRE(sixth.ok());
  std::vector<std::string> named;
  for (const std::string& warning : sixth->warnings()) {
    if (warning.find("same name") != std::string::npos) named.push_back(warning);
  }
  REQUIRE(named.size() == 4);
  CHECK(named[0] == "job job-2 (JOB_STATE_QUEUED) has the same name, 'tiny-cpu-demo'");
  CHECK(named[2] == "job job-4 (JOB_STATE_QUEUED) has the same name, 'tiny-cpu-demo'");
  CHECK(named[3] == "and 1 more job that has not ended has the same name, 'tiny-cpu-demo'");
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
  const v1::RegisterWorkerRequest worker = CpuWorker("w0");
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

// A worker cut off while its job moved on keeps the attempt until a heartbeat's reply names it;
// a job deleted meanwhile (after its end) is named too: else the worker would hold its memory
// for good, and count as free to the scheduler.
TEST_CASE("a heartbeat's reply ends attempts of jobs ended, deleted or never known", "[jobs]") {
  testing::TempDir dir;
  int64_t now = 0;
  auto controller = MakeController(dir.path(), &now);
  controller->StartRunner([](std::function<void()> task) { task(); }, RunnerOptions{});
  const v1::RegisterWorkerRequest worker = CpuWorker("w0");
  const auto registered = controller->RegisterWorker(worker);
  REQUIRE(registered.ok());
  // Needs GPUs: stays queued beside a CPU worker, so nothing contacts the worker's address.
  REQUIRE(controller->SubmitJob(FromFile("grpo-gsm8k-qwen05b.yaml")).ok());
  const auto ended = [&](const std::string& job_id) {
    v1::HeartbeatRequest beat;
    beat.set_worker_id("w0");
    beat.set_incarnation(registered->incarnation());
    v1::JobAttempt& attempt = *beat.add_hosted();
    attempt.set_job_id(job_id);
    attempt.set_attempt(1);
    const auto reply = controller->Heartbeat(beat);
    REQUIRE(reply.ok());
    return reply->end_size() == 1 && reply->end(0).job_id() == job_id;
  };
  CHECK(ended("job-1"));  // Known, not running there (queued).
  v1::CancelJobRequest cancel;
  cancel.set_job_id("job-1");
  REQUIRE(controller->CancelJob(cancel).ok());
  CHECK(ended("job-1"));  // Ended.
  v1::DeleteJobRequest remove;
  remove.set_job_id("job-1");
  REQUIRE(controller->DeleteJob(remove).ok());
  CHECK(ended("job-1"));   // Deleted after its end.
  CHECK(ended("job-99"));  // Never known here.
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

TEST_CASE("a tensor-parallel GPU rollout of a model the fused decode does not serve is warned of",
          "[job_manager]") {
  testing::TempDir dir;
  const auto spec_with = [&](int head_dim, int tp, const std::string& device) {
    const std::string model = absl::StrCat(dir.path(), "/model-", head_dim);
    REQUIRE(MakeDirectories(model).ok());
    REQUIRE(WriteFileAtomically(
                model + "/config.json",
                absl::StrCat(R"({"hidden_size": )", head_dim * 8, R"(, "num_attention_heads": 8})"))
                .ok());
    v1::JobSpec spec;
    spec.mutable_model()->set_path(model);
    spec.mutable_roles()->mutable_actor()->mutable_rollout()->set_tp(tp);
    spec.mutable_trainer()->set_device(device);
    return spec;
  };
  CHECK_THAT(
      SlowRolloutWarning(spec_with(80, 2, "cuda")),
      Catch::Contains("roles.actor.rollout.tp 2 on GPU workers: the model's head dim is 80"));
  CHECK(SlowRolloutWarning(spec_with(128, 2, "cuda")).empty());  // The fused decode serves it.
  CHECK(SlowRolloutWarning(spec_with(80, 1, "cuda")).empty());   // tp 1 keeps its KV cache.
  CHECK(SlowRolloutWarning(spec_with(80, 2, "cpu")).empty());    // CPU workers run no fused decode.
}

}  // namespace rlhfd::controller
