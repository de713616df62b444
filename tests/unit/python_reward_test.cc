// The Python reward pool (worker/reward/python_reward.h) with real Python processes running the
// runner shipped with the worker and the functions of tests/fixtures/python_rewards/: verl's
// arguments arrive exactly, reward_kwargs win, dicts with "score" count; a function that raises,
// hangs, exits, kills itself, returns text or outgrows its memory limit fails the batch with its
// traceback or what happened, within the deadline, and the pool serves the next batch.
#include "worker/reward/python_reward.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/support/subprocess.h"

namespace rlhfd::reward {
namespace {

using rlhfd::testing::TempDir;

const std::string kFunctions =
    std::string(RLHFD_FIXTURES_DIR) + "/python_rewards/misbehaving_rewards.py";

PythonRewardOptions Options(const std::string& name, const std::string& path = kFunctions) {
  return {.python = RLHFD_PYTHON,
          .runner = RLHFD_REWARD_RUNNER,
          .path = path,
          .name = name,
          .processes = 2,
          .timeout = absl::Seconds(5),
          .memory_limit_mb = 1024};
}

std::unique_ptr<PythonReward> Make(PythonRewardOptions options) {
  absl::StatusOr<std::unique_ptr<PythonReward>> made = PythonReward::Create(std::move(options));
  INFO(made.status());
  REQUIRE(made.ok());
  return *std::move(made);
}

std::vector<PythonRewardCall> Calls(int count) {
  std::vector<PythonRewardCall> calls;
  for (int i = 0; i < count; ++i) {
    calls.push_back({.data_source = "openai/gsm8k",
                     .solution_str = std::string(static_cast<size_t>(i + 1), 'x'),
                     .ground_truth = std::to_string(i),
                     .extra_info = {{"index", i}}});
  }
  return calls;
}

std::vector<nlohmann::json> ReadRecord(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

std::string MessageOf(const absl::Status& status) { return std::string(status.message()); }

// Whether `pid` is gone (or a zombie nobody has reaped yet).
// Whether `pid` has ended with every thread, its descriptors closed: reaped, or a zombie with no
// other thread left. (A killed process's main thread turns zombie before its other threads have
// exited, and the threads share its descriptors: the socket stays open until the last is gone.)
bool Ended(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  if (!stat) return true;
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  if (text.find(") Z ") == std::string::npos) return false;
  std::error_code error;
  int threads = 0;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), error)) {
    (void)task;
    ++threads;
  }
  return threads <= 1;
}

TEST_CASE("python reward: verl's arguments arrive exactly; reward_kwargs win", "[reward]") {
  TempDir dir;
  const std::string record = dir.path() + "/calls.jsonl";
  PythonRewardOptions options = Options("records");
  options.reward_kwargs = {{"record", record}, {"offset", 0.5}, {"style", {1, "two"}}};
  auto reward = Make(options);
  const nlohmann::json extra = nlohmann::json::parse(
      R"({"split": "train", "index": 7, "answer": "#### 3", "nested": {"a": [1, 2.5, null]}})");
  std::vector<PythonRewardCall> calls = {
      {.data_source = "openai/gsm8k",
       .solution_str = "The answer is 3.\n#### 3 ünïcode",
       .ground_truth = "3",
       .extra_info = extra},
      {.data_source = "countdown",
       .solution_str = "",
       .ground_truth = nlohmann::json::parse(R"({"target": 24, "numbers": [1, 2, 3]})"),
       .extra_info = nullptr}};
  const absl::StatusOr<std::vector<double>> scores = reward->Score(calls);
  INFO(scores.status());
  REQUIRE(scores.ok());
  // len() in Python counts code points: 31 here. Plus reward_kwargs' offset.
  CHECK(*scores == std::vector<double>{31 + 0.5, 0.5});
  std::vector<nlohmann::json> seen = ReadRecord(record);
  REQUIRE(seen.size() == 2);
  std::sort(seen.begin(), seen.end(),
            [](const auto& a, const auto& b) { return a["data_source"] < b["data_source"]; });
  // verl's reward manager adds num_turns and rollout_reward_scores to extra_info, {} when the
  // row has none.
  nlohmann::json expected_extra = extra;
  expected_extra["num_turns"] = nullptr;
  expected_extra["rollout_reward_scores"] = nlohmann::json::object();
  CHECK(seen[1]["data_source"] == "openai/gsm8k");
  CHECK(seen[1]["solution_str"] == "The answer is 3.\n#### 3 ünïcode");
  CHECK(seen[1]["ground_truth"] == "3");
  CHECK(seen[1]["extra_info"] == expected_extra);
  CHECK(seen[1]["kwargs"] == nlohmann::json::parse(R"({"offset": 0.5, "style": [1, "two"]})"));
  CHECK(seen[0]["data_source"] == "countdown");
  CHECK(seen[0]["ground_truth"] == calls[1].ground_truth);
  CHECK(seen[0]["extra_info"] ==
        nlohmann::json::parse(R"({"num_turns": null, "rollout_reward_scores": {}})"));
}

TEST_CASE(
    "python reward: a dict's score counts, prints do not disturb; calls spread over the "
    "pool",
    "[reward]") {
  auto reward = Make(Options("prints_and_scores"));
  const absl::StatusOr<std::vector<double>> scores = reward->Score(Calls(9), 100);
  INFO(scores.status());
  REQUIRE(scores.ok());
  CHECK(*scores == std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(reward->pids().size() == 2);  // the second process started on first use
  CHECK(reward->Score({})->empty());

  // Calls run in parallel: six of 1 s on two processes take about 3 s, not 6.
  auto slow = Make(Options("slow_when_asked"));
  std::vector<PythonRewardCall> calls(6,
                                      {.data_source = "s", .solution_str = "", .ground_truth = 1});
  const absl::Time start = absl::Now();
  REQUIRE(slow->Score(calls).ok());
  CHECK(absl::Now() - start < absl::Seconds(5));
}

TEST_CASE(
    "python reward: a misbehaving function fails the batch with its traceback; the pool "
    "serves the next",
    "[reward]") {
  struct Case {
    std::string name;
    std::vector<std::string> words;
  };
  const Case cases[] = {
      {"raises",
       {"row 1", "raised ValueError: cannot score", "Traceback", "misbehaving_rewards.py",
        "in raises", "ValueError: cannot score 'x", "': no answer found"}},
      {"returns_text", {"row 1", "returns_text returned a str", "'high'"}},
      {"returns_dict_without_score", {"a dict without 'score'", "['reward']"}},
      {"returns_nan", {"non-finite score (nan)"}},
      {"exits", {"exited with status 3", "takes its place"}},
      {"kills_itself", {"killed by signal 9", "takes its place"}},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      auto reward = Make(Options(c.name));
      const absl::StatusOr<std::vector<double>> failed = reward->Score(Calls(3), 10);
      REQUIRE(failed.status().code() == absl::StatusCode::kInvalidArgument);
      for (const std::string& word : c.words) {
        CHECK_THAT(MessageOf(failed.status()), Catch::Contains(word));
      }
      CHECK_THAT(MessageOf(failed.status()), !Catch::Contains("reward_runner.py"));
      // Every process is alive or replaced: a second batch fails the same way, not worse.
      const absl::StatusOr<std::vector<double>> again = reward->Score(Calls(3), 10);
      CHECK(again.status().code() == absl::StatusCode::kInvalidArgument);
    }
  }
}

TEST_CASE("python reward: a call past its deadline is killed within it; its process replaced",
          "[reward]") {
  PythonRewardOptions options = Options("hangs");
  options.timeout = absl::Seconds(1);
  auto reward = Make(options);
  const int64_t started = reward->started();
  const absl::Time start = absl::Now();
  const absl::StatusOr<std::vector<double>> hung = reward->Score(Calls(2), 4);
  const absl::Duration took = absl::Now() - start;
  REQUIRE(hung.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(MessageOf(hung.status()),
             Catch::Contains("did not return within 1s") && Catch::Contains("timeout_s"));
  CHECK(took < absl::Seconds(3));
  // The hung processes were killed: the next batch starts new ones and answers.
  std::vector<PythonRewardCall> fast = {{.data_source = "s", .solution_str = "fast"}};
  const absl::StatusOr<std::vector<double>> next = reward->Score(fast);
  INFO(next.status());
  REQUIRE(next.ok());
  CHECK(*next == std::vector<double>{0.5});
  CHECK(reward->started() > started);
}

TEST_CASE("python reward: a process killed while idle is replaced on the next batch", "[reward]") {
  auto reward = Make(Options("prints_and_scores"));
  REQUIRE(reward->Score(Calls(4)).ok());
  const std::vector<pid_t> before = reward->pids();
  REQUIRE(before.size() == 2);
  for (pid_t pid : before) ::kill(pid, SIGKILL);
  // Dead, not merely signalled: a zombie's socket is closed.
  for (pid_t pid : before) {
    REQUIRE(rlhfd::testing::WaitFor([&] { return Ended(pid); }, absl::Seconds(5)));
  }
  const absl::StatusOr<std::vector<double>> scores = reward->Score(Calls(4));
  INFO(scores.status());
  REQUIRE(scores.ok());
  CHECK(*scores == std::vector<double>{1, 2, 3, 4});
  for (pid_t pid : reward->pids()) {
    CHECK(std::find(before.begin(), before.end(), pid) == before.end());
  }
}

TEST_CASE("python reward: processes end with their worker, even in the middle of a call",
          "[reward]") {
  // A stand-in for the worker, forked: it starts a pool, has one process hang in a call, reports
  // the pids and ends without cleaning up, as a worker killed with SIGKILL would.
  int report[2];
  REQUIRE(::pipe(report) == 0);
  const pid_t worker = ::fork();
  REQUIRE(worker >= 0);
  if (worker == 0) {
    ::close(report[0]);
    auto created = PythonReward::Create(Options("hangs"));
    if (!created.ok()) ::_exit(2);
    std::unique_ptr<PythonReward> reward = *std::move(created);
    std::thread([&] { (void)reward->Score(Calls(2)); }).detach();
    for (int i = 0; i < 100 && reward->pids().size() < 2; ++i) ::usleep(50'000);
    ::usleep(300'000);  // the calls are under way
    for (pid_t pid : reward->pids()) {
      if (::write(report[1], &pid, sizeof(pid)) != sizeof(pid)) ::_exit(3);
    }
    ::_exit(0);
  }
  ::close(report[1]);
  std::vector<pid_t> pids;
  pid_t pid = 0;
  while (::read(report[0], &pid, sizeof(pid)) == sizeof(pid)) pids.push_back(pid);
  ::close(report[0]);
  int status = 0;
  REQUIRE(::waitpid(worker, &status, 0) == worker);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  REQUIRE(pids.size() == 2);
  for (pid_t process : pids) {
    INFO("process " << process);
    CHECK(rlhfd::testing::WaitFor([&] { return Ended(process); }, absl::Seconds(5)));
  }
}

TEST_CASE("python reward: the memory limit holds a process; over it the function fails",
          "[reward]") {
  PythonRewardOptions options = Options("allocates");
  options.memory_limit_mb = 256;
  options.reward_kwargs = {{"megabytes", 512}};
  auto reward = Make(options);
  const absl::StatusOr<std::vector<double>> over = reward->Score(Calls(1));
  REQUIRE(over.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(MessageOf(over.status()), Catch::Contains("MemoryError"));
  // Within the limit it scores.
  options.reward_kwargs = {{"megabytes", 64}};
  auto within = Make(options);
  const absl::StatusOr<std::vector<double>> scores = within->Score(Calls(1));
  INFO(scores.status());
  REQUIRE(scores.ok());
  CHECK(*scores == std::vector<double>{1.0});
}

TEST_CASE("python reward: what cannot start fails at creation, saying why", "[reward]") {
  SECTION("the file's import fails: its traceback") {
    const auto made = PythonReward::Create(Options(
        "compute_score", std::string(RLHFD_FIXTURES_DIR) + "/python_rewards/fails_on_import.py"));
    REQUIRE(made.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(MessageOf(made.status()), Catch::Contains("ModuleNotFoundError") &&
                                             Catch::Contains("this_module_does_not_exist") &&
                                             Catch::Contains("fails_on_import.py"));
  }
  SECTION("the file's import writes a setup reply of its own to the runner's socket") {
    const auto made = PythonReward::Create(
        Options("compute_score",
                std::string(RLHFD_FIXTURES_DIR) + "/python_rewards/answers_setup_itself.py"));
    REQUIRE(made.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(MessageOf(made.status()), Catch::Contains("something else than the runner's reply"));
  }
  SECTION("no such file, no such function, not a function") {
    const auto missing = PythonReward::Create(Options("compute_score", "/nonexistent/reward.py"));
    CHECK_THAT(MessageOf(missing.status()),
               Catch::Contains("/nonexistent/reward.py") && Catch::Contains("not found"));
    const auto no_name = PythonReward::Create(Options("no_such_function"));
    CHECK_THAT(MessageOf(no_name.status()), Catch::Contains("no_such_function"));
    const auto not_callable = PythonReward::Create(Options("not_a_function"));
    CHECK_THAT(MessageOf(not_callable.status()), Catch::Contains("not a function"));
  }
  SECTION("no interpreter") {
    PythonRewardOptions options = Options("raises");
    options.python = "/nonexistent/python3";
    const auto made = PythonReward::Create(options);
    CHECK(made.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(MessageOf(made.status()), Catch::Contains("RLHFD_PYTHON"));
  }
}

}  // namespace
}  // namespace rlhfd::reward
