// The RL stages through real rlhfd-worker processes on loopback, driven over gRPC by the stage
// client the controller uses (no LibTorch on that side): PPO and GRPO steps equal one process;
// kill -9 of every worker after a save, then restart, load and step equals the uninterrupted
// run bitwise; a save cut short by a kill is never loaded; a worker killed mid-step makes every
// rank fail within the collective timeout; a data error on one rank fails the step at once and
// ending the job interrupts the rank waiting for it; a reward server answering garbage is an error;
// a worker's stage API takes only the controller's stage token, never a user's token.
#include <ATen/ATen.h>
#include <signal.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/auth.h"
#include "common/rpc/grpc_options.h"
#include "common/stages/stage_service.h"
#include "common/util/files.h"
#include "controller/cluster/pool_placement.h"
#include "controller/driver/job_stages.h"
#include "tests/roles/step_check.h"
#include "tests/support/cluster_fixture.h"
#include "tests/support/controller_client.h"
#include "worker/model/state_dict.h"

namespace rlhfd::roles {
namespace {

using controller::JobStages;
using controller::JobStagesOptions;
using controller::Metrics;
using controller::PlacePools;
using controller::StepPlan;
using controller::WorldSize;
using rlhfd::testing::LocalCluster;
using rlhfd::testing::Subprocess;
using rlhfd::testing::TempDir;
using stages::CallStage;
using stages::MakeGrpcStageService;
using stages::StageService;
using testing::TestPrompts;
using testing::TestSpec;

// `count` CPU workers, and a stage client per worker. A controller runs only while workers
// register (they get the stage token from it): this test drives the jobs itself, and a
// controller's heartbeat reply would end them as jobs it does not know (deleted ones, for it)
// at the workers' next heartbeat, a second after the job starts.
class Workers {
 public:
  explicit Workers(int count)
      : cluster_({RLHFD_CONTROLLER_BIN, RLHFD_WORKER_BIN, RLHFD_CTL_BIN}, absl::Seconds(1),
                 absl::Seconds(10)) {
    // One thread per worker: their arithmetic is then the same from run to run (bitwise).
    setenv("OMP_NUM_THREADS", "1", 1);
    StartController();
    for (int i = 0; i < count; ++i) cluster_.StartWorker();
    for (int i = 0; i < count; ++i) Connect(i);
    cluster_.StopController(SIGTERM);
  }

  std::vector<StageService*> services() {
    std::vector<StageService*> out;
    for (auto& service : services_) out.push_back(service.get());
    return out;
  }
  LocalCluster& cluster() { return cluster_; }

  void KillAll() {
    for (size_t i = 0; i < services_.size(); ++i) cluster_.worker(i).Stop(SIGKILL, absl::Seconds(5));
  }
  void RestartAll() {
    StartController();
    for (size_t i = 0; i < services_.size(); ++i) {
      cluster_.RestartWorker(i);
      Connect(static_cast<int>(i));
    }
    cluster_.StopController(SIGTERM);
  }

 private:
  void StartController() {
    std::string error;
    const bool started = cluster_.StartController(&error);
    INFO(error);
    REQUIRE(started);
  }
  void Connect(int index) {
    const int port = cluster_.WorkerPort(index);
    REQUIRE(port > 0);
    auto channel = MakeChannel(absl::StrCat("127.0.0.1:", port), RpcOptions{});
    REQUIRE(channel.ok());
    // The controller's stage token, which the worker accepts once it has registered.
    auto token = rlhfd::testing::StageToken(cluster_);
    REQUIRE(token.ok());
    REQUIRE(rlhfd::testing::WaitForStageToken(port, *token, absl::Seconds(30)));
    if (services_.size() <= static_cast<size_t>(index)) services_.resize(index + 1);
    services_[index] = MakeGrpcStageService(*channel, *token);
  }

  LocalCluster cluster_;
  std::vector<std::unique_ptr<StageService>> services_;
};

// How many of `pid`'s threads sleep in poll(2): the socket communicator waits for its peers there
// (gRPC's threads wait in epoll or on futexes).
int ThreadsInPoll(pid_t pid) {
  int polling = 0;
  std::error_code error;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), error)) {
    std::ifstream wchan(task.path() / "wchan");
    std::string where;
    std::getline(wchan, where);
    if (absl::StrContains(where, "poll_schedule_timeout")) ++polling;
  }
  return polling;
}

JobStagesOptions Options() {
  return {.stage_deadline = absl::Minutes(5), .communicator_timeout_ms = 8000};
}

// `spec` with its checkpoints and batch dumps under `directory`: the only places a worker writes.
v1::JobSpec WithDirectories(v1::JobSpec spec, const std::string& directory) {
  spec.mutable_trainer()->set_checkpoint_dir(directory + "/checkpoints");
  spec.mutable_trainer()->set_rollout_data_dir(directory + "/dumps");
  return spec;
}

// GRPO with every role on one worker, writing under `directory`.
v1::JobSpec OneWorkerGrpo(const std::string& directory) {
  return WithDirectories(
      TestSpec(testing::kGrpoJob, {"placement=colocated", "roles.actor.gpus=1",
                                   "roles.reference.gpus=1", "roles.reward.gpus=1"}),
      directory);
}

TEST_CASE("PPO and GRPO steps through worker processes equal one process", "[roles][processes]") {
  at::set_num_threads(1);
  SECTION("PPO (GAE): actor dp 2, critic, reference, reward model") {
    const v1::JobSpec spec = TestSpec(testing::kPpoJob);
    Workers workers(WorldSize(PlacePools(spec)));
    testing::CheckAgainstOneProcess(spec, workers.services(), 4, 2);
  }
  SECTION("GRPO, n = 4: actor dp 2, reference, reward model") {
    const v1::JobSpec spec = TestSpec(testing::kGrpoJob);
    Workers workers(WorldSize(PlacePools(spec)));
    testing::CheckAgainstOneProcess(spec, workers.services(), 2, 2);
  }
  SECTION("PPO with the actor's rollout at tp_g 2: greedy responses equal tp_g 1") {
    const v1::JobSpec spec =
        TestSpec(testing::kPpoJob, {"roles.actor.rollout.tp=2", "trainer.device=cpu"});
    Workers workers(WorldSize(PlacePools(spec)));
    testing::CheckAgainstOneProcess(spec, workers.services(), 4, 2);
  }
}

// Every tensor of every file under `a` equals its namesake under `b`, bitwise.
void CheckSameFiles(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    auto left = model::StateDict::Load(a[i]);
    auto right = model::StateDict::Load(b[i]);
    REQUIRE(left.ok());
    REQUIRE(right.ok());
    REQUIRE(left->names() == right->names());
    for (const std::string& name : left->names()) {
      INFO(a[i] << " " << name);
      CHECK(at::equal(*left->Get(name), *right->Get(name)));
    }
  }
}

std::vector<std::string> StateFiles(const std::string& directory, int64_t step,
                                    const std::vector<std::string>& roles, int ranks) {
  std::vector<std::string> files;
  for (const std::string& role : roles) {
    for (int rank = 0; rank < ranks; ++rank) {
      const std::string path =
          absl::StrCat(directory, "/step_", step, "/", role, "/rank_", rank, "/state.safetensors");
      if (PathExists(path)) files.push_back(path);
    }
  }
  return files;
}

TEST_CASE("kill -9 every worker after a save: restarted and loaded, the next step is bitwise "
          "that of the uninterrupted run",
          "[roles][processes]") {
  at::set_num_threads(1);
  TempDir dir;
  const v1::JobSpec straight_spec =
      WithDirectories(TestSpec(testing::kPpoJob), dir.path() + "/straight");
  const v1::JobSpec spec = WithDirectories(TestSpec(testing::kPpoJob), dir.path() + "/killed");
  const int world = WorldSize(PlacePools(spec));
  const auto plan = [](int64_t step) {
    return StepPlan{.step = step,
                    .prompts = TestPrompts(4),
                    .seed = static_cast<uint64_t>(40 + step),
                    .kl_coef = 0.05};
  };
  std::vector<std::string> uninterrupted_dumps;
  {
    Workers workers(world);
    JobStages job("job-straight", straight_spec, workers.services(), Options());
    REQUIRE(job.Start(2).ok());
    REQUIRE(job.RunStep(plan(1)).ok());
    REQUIRE(job.SaveCheckpoint(1, false).ok());
    REQUIRE(job.RunStep(plan(2)).ok());
    auto dumps = job.DumpBatch(2);
    REQUIRE(dumps.ok());
    uninterrupted_dumps = *dumps;
    REQUIRE(job.SaveCheckpoint(2, false).ok());
    job.End();
  }
  Workers workers(world);
  {
    JobStages job("job-killed", spec, workers.services(), Options());
    REQUIRE(job.Start(2).ok());
    REQUIRE(job.RunStep(plan(1)).ok());
    REQUIRE(job.SaveCheckpoint(1, false).ok());
  }
  workers.KillAll();
  workers.RestartAll();
  JobStages job("job-killed", spec, workers.services(), Options());
  REQUIRE(job.Start(2).ok());
  auto loaded = job.LoadCheckpoint(0);
  REQUIRE(loaded.ok());
  CHECK(*loaded == 1);
  auto stepped = job.RunStep(plan(2));
  INFO((stepped.ok() ? "" : std::string(stepped.status().message())));
  REQUIRE(stepped.ok());
  auto dumps = job.DumpBatch(2);
  REQUIRE(dumps.ok());
  CheckSameFiles(*dumps, uninterrupted_dumps);
  REQUIRE(job.SaveCheckpoint(2, false).ok());
  CheckSameFiles(StateFiles(spec.trainer().checkpoint_dir(), 2, {"actor", "critic"}, 2),
                 StateFiles(straight_spec.trainer().checkpoint_dir(), 2, {"actor", "critic"}, 2));
  job.End();
}

TEST_CASE("a save cut short by a kill is never loaded; the one before it is",
          "[roles][processes]") {
  at::set_num_threads(1);
  TempDir dir;
  const v1::JobSpec spec = OneWorkerGrpo(dir.path());
  const std::string checkpoints = spec.trainer().checkpoint_dir();
  Workers workers(1);
  {
    JobStages job("job-torn", spec, workers.services(), Options());
    REQUIRE(job.Start(3).ok());
    REQUIRE(job.RunStep({.step = 1, .prompts = TestPrompts(2), .seed = 1}).ok());
    REQUIRE(job.SaveCheckpoint(1, false).ok());
    REQUIRE(job.RunStep({.step = 2, .prompts = TestPrompts(2), .seed = 2}).ok());
    // The save of step 2 with a kill racing it.
    auto saving = std::async(std::launch::async,
                             [&] { return job.SaveCheckpoint(2, /*export_huggingface=*/true); });
    workers.KillAll();
    (void)saving.get();
  }
  // `latest` names step 1, or step 2 only if every rank's save of it finished.
  std::ifstream latest(checkpoints + "/latest");
  std::string named;
  std::getline(latest, named);
  const bool second_committed = named == "step_2";
  if (!second_committed) CHECK(named == "step_1");
  if (second_committed) {
    CHECK(PathExists(checkpoints + "/step_2/actor/rank_0/manifest.json"));
  }
  workers.RestartAll();
  JobStages job("job-torn", spec, workers.services(), Options());
  REQUIRE(job.Start(3).ok());
  auto loaded = job.LoadCheckpoint(0);
  REQUIRE(loaded.ok());
  CHECK(*loaded == (second_committed ? 2 : 1));
  // What was loaded is bitwise what that step saved: saved again as step 9, the same tensors.
  REQUIRE(job.SaveCheckpoint(9, false).ok());
  CheckSameFiles(StateFiles(checkpoints, 9, {"actor"}, 1),
                 StateFiles(checkpoints, *loaded, {"actor"}, 1));
  // Asked for by number, a step whose rank's save did not finish (its manifest missing) is
  // passed over for the step before it, naming what is missing.
  (void)RemoveTree(checkpoints + "/step_2/actor/rank_0/manifest.json");
  auto torn = job.LoadCheckpoint(2);
  INFO(torn.status().ToString());
  REQUIRE(torn.ok());
  CHECK(*torn == 1);
  REQUIRE(job.passed_over().size() == 1);
  CHECK_THAT(job.passed_over()[0], Catch::StartsWith("step 2: " + checkpoints + "/step_2"));
  job.End();
}

TEST_CASE("a worker killed in the middle of a step: every rank fails within the timeout",
          "[roles][processes]") {
  at::set_num_threads(1);
  const v1::JobSpec spec = TestSpec(testing::kPpoJob);
  Workers workers(WorldSize(PlacePools(spec)));
  JobStages job("job-peer", spec, workers.services(), Options());
  REQUIRE(job.Start(1).ok());
  REQUIRE(job.RunStep({.step = 1, .prompts = TestPrompts(4), .seed = 1, .kl_coef = 0.05}).ok());
  // The critic is stopped before step 2 and killed while the step runs: the step cannot finish
  // without it, so the kill lands in the middle of the step however slow or fast the machine is.
  Subprocess& critic = workers.cluster().worker(2);
  REQUIRE(::kill(critic.pid(), SIGSTOP) == 0);
  const absl::Time start = absl::Now();
  auto step = std::async(std::launch::async, [&] {
    return job.RunStep({.step = 2, .prompts = TestPrompts(4), .seed = 2, .kl_coef = 0.05});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  critic.Stop(SIGKILL, absl::Seconds(5));
  const absl::StatusOr<Metrics> result = step.get();
  REQUIRE_FALSE(result.ok());
  INFO(result.status().message());
  CHECK(absl::Now() - start < absl::Seconds(60));
  // The others are alive, answer, and say what happened to the job's communicator.
  for (int rank : {0, 1, 3, 4}) CHECK(workers.cluster().worker(rank).running());
  v1::ForwardRequest forward;
  forward.mutable_key()->set_job_id("job-peer");
  forward.mutable_key()->set_step(2);
  forward.mutable_key()->set_stage("after the loss");
  forward.mutable_key()->set_attempt(1);
  forward.set_kind(v1::FORWARD_KIND_REF_LOG_PROBS);
  auto after = CallStage(*workers.services()[3], &StageService::Forward, forward, absl::Seconds(30));
  CHECK(after.status().code() != absl::StatusCode::kDeadlineExceeded);
}

TEST_CASE(
    "a data error on one rank fails the step at once; ending the job frees the rank "
    "waiting for it in a collective",
    "[roles][processes][faults]") {
  at::set_num_threads(1);
  const v1::JobSpec spec = TestSpec(
      testing::kGrpoJob, {"placement=colocated", "roles.reference.gpus=2", "~roles.reward.model",
                          "~roles.reward.gpus", "roles.reward.rule=exact_match"});
  Workers workers(WorldSize(PlacePools(spec)));
  REQUIRE(workers.services().size() == 2);
  // A collective timeout far above the bounds below: waiting it out would fail them.
  JobStagesOptions options = Options();
  options.communicator_timeout_ms = 120000;
  JobStages job("job-bad-row", spec, workers.services(), options);
  REQUIRE(job.Start(1).ok());
  // Rank 0's share holds a row whose chat turn has no role: rank 0 refuses it before generating,
  // while rank 1 generates and waits for rank 0 to agree the batch's lengths.
  std::vector<v1::PromptRow> prompts = TestPrompts(2);
  prompts[0].mutable_chat(0)->clear_role();
  // Rank 0 is held (SIGSTOP) until rank 1 waits in the collective, so that rank 1 is waiting
  // when the step fails, however the two ranks' calls are scheduled.
  Subprocess& rank0 = workers.cluster().worker(0);
  const int polling_before = ThreadsInPoll(workers.cluster().worker(1).pid());
  REQUIRE(::kill(rank0.pid(), SIGSTOP) == 0);
  const absl::Time start = absl::Now();
  auto running = std::async(
      std::launch::async, [&] { return job.RunStep({.step = 1, .prompts = prompts, .seed = 1}); });
  const bool rank1_waits = rlhfd::testing::WaitFor(
      [&] { return ThreadsInPoll(workers.cluster().worker(1).pid()) > polling_before; },
      absl::Seconds(60));
  REQUIRE(::kill(rank0.pid(), SIGCONT) == 0);
  REQUIRE(rank1_waits);
  const absl::StatusOr<Metrics> step = running.get();
  const absl::Duration failed_after = absl::Now() - start;
  REQUIRE_FALSE(step.ok());
  INFO(step.status().message() << " after " << absl::FormatDuration(failed_after));
  CHECK(step.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(step.status().message()),
             Catch::Contains("rank 0") && Catch::Contains("a chat turn has no role"));
  CHECK(failed_after < absl::Seconds(30));
  // Ending the job (as the driver does next) interrupts rank 1's wait: both ranks answer EndJob
  // well within the collective timeout, and take a new job at once.
  const absl::Time ending = absl::Now();
  job.End(absl::Seconds(60));
  const absl::Duration ended_after = absl::Now() - ending;
  INFO("ended after " << absl::FormatDuration(ended_after));
  CHECK(ended_after < absl::Seconds(30));
  WARN("the step failed after " << absl::FormatDuration(failed_after) << ", the job ended "
                                << absl::FormatDuration(ended_after) << " later (collective "
                                << "timeout 120s)");
  // Rank 1's generate ended on the end of the job: interrupted by its EndJob, or by rank 0
  // closing its connections on its own EndJob, whichever came first.
  CHECK_THAT(workers.cluster().worker(1).ReadLog(),
             Catch::Contains("step 1 generate: the job's attempt was ended while it waited for "
                             "its peers") ||
                 Catch::Contains("step 1 generate: recv from rank 0: Connection reset by peer"));
  JobStages next("job-after", spec, workers.services(), options);
  REQUIRE(next.Start(1).ok());
  const absl::StatusOr<Metrics> good =
      next.RunStep({.step = 1, .prompts = TestPrompts(2), .seed = 1});
  INFO(good.status());
  CHECK(good.ok());
  next.End();
}

TEST_CASE("a worker's stage API refuses every token but the controller's stage token",
          "[roles][processes][auth]") {
  at::set_num_threads(1);
  TempDir dir;
  const v1::JobSpec spec = OneWorkerGrpo(dir.path());
  Workers workers(1);
  const int port = workers.cluster().WorkerPort(0);
  auto channel = MakeChannel(absl::StrCat("127.0.0.1:", port), RpcOptions{});
  REQUIRE(channel.ok());
  const std::string state = workers.cluster().state_dir();
  // The admin token (what rlhfctl and the workers' registration hold), the read-only one
  // (scrapers, dashboards), none, and a made-up one.
  for (const std::string& token :
       {*ResolveClientToken("", state + "/token"), *ResolveClientToken("", state + "/read_token"),
        std::string(), std::string("0123456789abcdef")}) {
    INFO("token '" << token << "'");
    std::unique_ptr<StageService> intruder = MakeGrpcStageService(*channel, token);
    JobStages job("job-intruder", spec, {intruder.get()}, Options());
    const absl::Status started = job.Start(1);
    CHECK(started.code() == absl::StatusCode::kUnauthenticated);
    CHECK_THAT(std::string(started.message()), Catch::Contains("bearer token"));
    v1::CheckpointRequest load;
    load.mutable_key()->set_job_id("job-intruder");
    load.mutable_key()->set_step(1);
    load.mutable_key()->set_stage("load");
    load.mutable_key()->set_attempt(1);
    load.set_directory("/etc");
    CHECK(CallStage(*intruder, &StageService::LoadCheckpoint, load, absl::Seconds(30))
              .status()
              .code() == absl::StatusCode::kUnauthenticated);
  }
  CHECK_FALSE(PathExists(dir.path() + "/checkpoints"));
  // The controller's token, which the worker got when it registered, opens it.
  JobStages job("job-controller", spec, workers.services(), Options());
  REQUIRE(job.Start(1).ok());
  REQUIRE(job.RunStep({.step = 1, .prompts = TestPrompts(2), .seed = 1}).ok());
  REQUIRE(job.SaveCheckpoint(1, false).ok());
  CHECK(PathExists(dir.path() + "/checkpoints/latest"));
  // Even with it, a call reaches only the attempt it names (never "0: whichever runs"), and a
  // directory other than the job's own is refused before anything is read or written.
  StageService& worker = *workers.services()[0];
  for (const std::string& directory : std::vector<std::string>{
           dir.path() + "/elsewhere", "/tmp", "/etc", dir.path() + "/checkpoints/../elsewhere"}) {
    INFO(directory);
    v1::CheckpointRequest save;
    save.mutable_key()->set_job_id("job-controller");
    save.mutable_key()->set_step(1);
    save.mutable_key()->set_stage("save elsewhere");
    save.mutable_key()->set_attempt(1);
    save.set_directory(directory);
    save.set_step(5);
    CHECK(
        CallStage(worker, &StageService::SaveCheckpoint, save, absl::Seconds(30)).status().code() ==
        absl::StatusCode::kPermissionDenied);
    v1::CheckpointRequest load = save;
    load.mutable_key()->set_stage("load");
    CHECK(
        CallStage(worker, &StageService::LoadCheckpoint, load, absl::Seconds(30)).status().code() ==
        absl::StatusCode::kPermissionDenied);
  }
  CHECK_FALSE(PathExists(dir.path() + "/elsewhere"));
  v1::CheckpointRequest load;
  load.mutable_key()->set_job_id("job-controller");
  load.mutable_key()->set_step(1);
  load.mutable_key()->set_stage("load");
  load.set_directory(dir.path() + "/checkpoints");
  CHECK(CallStage(worker, &StageService::LoadCheckpoint, load, absl::Seconds(30)).status().code() ==
        absl::StatusCode::kInvalidArgument);  // attempt 0
  job.End();
}

TEST_CASE("a reward server answering garbage is an error naming it; the worker lives on",
          "[roles][processes]") {
  at::set_num_threads(1);
  TempDir dir;
  const int port = rlhfd::testing::FreeLoopbackPort();
  rlhfd::testing::Subprocess server(
      {"/bin/sh", "-c",
       absl::StrCat("cd ", dir.path(), " && exec ", RLHFD_PYTHON, " ", RLHFD_REWARD_SERVER, " ",
                    port, " malformed")},
      dir.path() + "/server.log");
  REQUIRE(rlhfd::testing::WaitFor(
      [&] { return server.ReadLog().find("serving") != std::string::npos; }, absl::Seconds(20)));
  const std::string url = absl::StrCat("http://127.0.0.1:", port, "/score");
  const v1::JobSpec spec = TestSpec(
      testing::kGrpoJob, {"placement=colocated", "roles.actor.gpus=1", "roles.reference.gpus=1",
                          "~roles.reward.model", "~roles.reward.gpus",
                          "roles.reward.remote=" + url, "roles.reward.remote_timeout_s=2"});
  Workers workers(1);
  JobStages job("job-garbage", spec, workers.services(), Options());
  REQUIRE(job.Start(1).ok());
  auto step = job.RunStep({.step = 1, .prompts = TestPrompts(2), .seed = 1});
  REQUIRE_FALSE(step.ok());
  CHECK_THAT(std::string(step.status().message()),
             Catch::Contains(url) && Catch::Contains("not JSON"));
  CHECK(workers.cluster().worker(0).running());
  job.End();
}

}  // namespace
}  // namespace rlhfd::roles
