// The remote reward client against a real HTTP server process (tests/reward/reward_server.py)
// in each of its failure modes, and against nothing at all.
#include <catch2/catch.hpp>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/support/subprocess.h"
#include "worker/reward/remote_reward.h"

namespace rlhfd::reward {
namespace {

using rlhfd::testing::FreeLoopbackPort;
using rlhfd::testing::Subprocess;
using rlhfd::testing::TempDir;

// A reward server in `mode`, up and answering, in its own directory.
class RewardServer {
 public:
  explicit RewardServer(const std::string& mode)
      : port_(FreeLoopbackPort()),
        process_({"/bin/sh", "-c",
                  absl::StrCat("cd ", dir_.path(), " && exec ", RLHFD_PYTHON, " ",
                               RLHFD_REWARD_SERVER, " ", port_, " ", mode)},
                 dir_.path() + "/server.log") {
    REQUIRE(rlhfd::testing::WaitFor(
        [&] { return process_.ReadLog().find("serving") != std::string::npos; },
        absl::Seconds(20)));
  }
  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_, "/score"); }
  // The body of the last request the server read.
  nlohmann::json last_request() const {
    std::ifstream in(absl::StrCat(dir_.path(), "/", port_, ".request.json"));
    return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  }
  int served() const {
    std::ifstream in(absl::StrCat(dir_.path(), "/", port_, ".count"));
    int count = 0;
    in >> count;
    return count;
  }

 private:
  TempDir dir_;
  int port_;
  Subprocess process_;
};

RemoteRewardRequest TwoRows() {
  return {.queries = {"Q: 1+1? A: 2", "Q: 2+2? A: 5"},
          .prompts = {"Q: 1+1? A:", "Q: 2+2? A:"},
          .labels = {"2", 4},
          .responses = {" 2", " 5"},
          .data_sources = {"openai/gsm8k", "lighteval/MATH"},
          .extra_infos = {nlohmann::json{{"split", "train"}, {"index", 7}}, nullptr}};
}

RemoteRewardOptions Options(const std::string& url) {
  return {.url = url, .timeout = absl::Seconds(1), .max_attempts = 3,
          .first_backoff = absl::Milliseconds(50)};
}

std::string MessageOf(const absl::Status& status) { return std::string(status.message()); }

TEST_CASE("remote reward: OpenRLHF's protocol against a real server", "[reward]") {
  RewardServer server("ok");
  const absl::StatusOr<std::vector<double>> rewards =
      RemoteReward(Options(server.url())).Score(TwoRows());
  REQUIRE(rewards.ok());
  CHECK(*rewards == std::vector<double>{1.0, 0.0});
  // What a verl compute_score takes travels beside OpenRLHF's keys, the prompt and the response
  // apart as well as joined.
  const nlohmann::json sent = server.last_request();
  CHECK(sent["query"] == nlohmann::json{"Q: 1+1? A: 2", "Q: 2+2? A: 5"});
  CHECK(sent["prompts"] == nlohmann::json{"Q: 1+1? A:", "Q: 2+2? A:"});
  CHECK(sent["labels"] == nlohmann::json::parse(R"(["2", 4])"));
  CHECK(sent["responses"] == nlohmann::json{" 2", " 5"});
  CHECK(sent["data_sources"] == nlohmann::json{"openai/gsm8k", "lighteval/MATH"});
  CHECK(sent["extra_infos"] == nlohmann::json::parse(R"([{"split": "train", "index": 7}, null])"));
  CHECK(RemoteReward(Options(server.url())).Score({})->empty());
}

TEST_CASE("remote reward: transient failures are retried, with backoff", "[reward]") {
  RewardServer server("flaky");  // 503 twice, then answers
  const absl::StatusOr<std::vector<double>> rewards =
      RemoteReward(Options(server.url())).Score(TwoRows());
  REQUIRE(rewards.ok());
  CHECK(server.served() == 3);
}

TEST_CASE("remote reward: every failure names the URL and what came back", "[reward]") {
  SECTION("down") {
    const std::string url = absl::StrCat("http://127.0.0.1:", FreeLoopbackPort(), "/score");
    const absl::Time start = absl::Now();
    const absl::StatusOr<std::vector<double>> rewards = RemoteReward(Options(url)).Score(TwoRows());
    REQUIRE(rewards.status().code() == absl::StatusCode::kUnavailable);
    CHECK_THAT(MessageOf(rewards.status()), Catch::Contains(url) && Catch::Contains("3 attempts"));
    CHECK(absl::Now() - start < absl::Seconds(5));
  }
  SECTION("slow: past the deadline of each attempt") {
    RewardServer server("slow");
    RemoteRewardOptions options = Options(server.url());
    options.max_attempts = 2;
    const absl::Time start = absl::Now();
    const absl::StatusOr<std::vector<double>> rewards = RemoteReward(options).Score(TwoRows());
    REQUIRE(rewards.status().code() == absl::StatusCode::kDeadlineExceeded);
    CHECK_THAT(MessageOf(rewards.status()),
               Catch::Contains(server.url()) && Catch::Contains("remote_timeout_s"));
    CHECK(absl::Now() - start < absl::Seconds(4));  // 2 x 1 s + backoff, not 2 x 5 s
  }
  SECTION("malformed JSON") {
    RewardServer server("malformed");
    const absl::StatusOr<std::vector<double>> rewards =
        RemoteReward(Options(server.url())).Score(TwoRows());
    REQUIRE(rewards.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(MessageOf(rewards.status()),
               Catch::Contains(server.url()) && Catch::Contains("this is not json"));
    CHECK(server.served() == 1);  // not retried
  }
  SECTION("one reward short") {
    RewardServer server("wrong_count");
    const absl::StatusOr<std::vector<double>> rewards =
        RemoteReward(Options(server.url())).Score(TwoRows());
    CHECK_THAT(MessageOf(rewards.status()), Catch::Contains("1 rewards for 2 queries"));
  }
  SECTION("a reward that is not a number") {
    RewardServer server("not_number");
    const absl::StatusOr<std::vector<double>> rewards =
        RemoteReward(Options(server.url())).Score(TwoRows());
    CHECK_THAT(MessageOf(rewards.status()), Catch::Contains("rewards[0]") && Catch::Contains("high"));
  }
  SECTION("HTTP 400 is not retried") {
    RewardServer server("bad_request");
    const absl::StatusOr<std::vector<double>> rewards =
        RemoteReward(Options(server.url())).Score(TwoRows());
    REQUIRE(rewards.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(MessageOf(rewards.status()),
               Catch::Contains("HTTP 400") && Catch::Contains("labels missing"));
    CHECK(server.served() == 1);
  }
  SECTION("cancelled") {
    RewardServer server("slow");
    std::atomic<bool> cancelled{false};
    std::thread cancel([&] {
      absl::SleepFor(absl::Milliseconds(200));
      cancelled = true;
    });
    RemoteRewardOptions options = Options(server.url());
    options.timeout = absl::Seconds(10);
    const absl::Time start = absl::Now();
    const absl::StatusOr<std::vector<double>> rewards =
        RemoteReward(options).Score(TwoRows(), &cancelled);
    cancel.join();
    CHECK(rewards.status().code() == absl::StatusCode::kCancelled);
    CHECK(absl::Now() - start < absl::Seconds(3));
  }
}

}  // namespace
}  // namespace rlhfd::reward
