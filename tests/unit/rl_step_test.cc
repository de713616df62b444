// The driver's step over stage services that answer with empty replies: which pools' work runs
// at once. Split pools (disjoint ranks) run the old log-prob, reference, value and reward model
// forwards together, and the critic's update with the actor's; colocated pools share their
// ranks, and their forwards and updates take turns. A forward that fails on split pools cancels
// the others.
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "controller/driver/job_stages.h"
#include "controller/driver/step_metrics.h"
#include "tests/bench/empty_stages.h"
#include "tests/bench/simulated_job.h"

namespace rlhfd::controller {
namespace {

// Calls of one group (the forwards, or the updates) that wait for each other: each is held until
// `meet` kinds of the group have been in flight together, or for the patience.
struct Gathering {
  size_t meet = 1;
  std::multiset<std::string> in_flight;
  size_t most_kinds_at_once = 0;
  bool met = false;  // the kinds were in flight together once: later calls need not wait
};

// What the fake ranks saw. A forward of kind `fails` fails at once.
struct Seen {
  std::optional<v1::ForwardKind> fails;
  std::mutex mutex;
  std::condition_variable changed;
  Gathering forwards, updates;
};

size_t Kinds(const std::multiset<std::string>& in_flight) {
  return std::set<std::string>(in_flight.begin(), in_flight.end()).size();
}

// A rank whose stages answer at once, except Forward, UpdateActor and UpdateCritic, which answer
// on a thread of their own once their group has gathered (or when cancelled).
class MeetingStages final : public bench::EmptyStages {
 public:
  MeetingStages(Seen& seen, std::chrono::milliseconds patience)
      : seen_(seen), patience_(patience) {}
  ~MeetingStages() override {
    for (std::thread& thread : threads_) thread.join();
  }

  void Forward(const v1::ForwardRequest& request, absl::Duration,
               stages::StageDone<v1::ForwardReply> done) override {
    if (seen_.fails == request.kind()) {
      done(absl::UnavailableError("this rank was lost"));
      return;
    }
    Hold(seen_.forwards, absl::StrCat("forward ", request.kind()), std::move(done));
  }
  void UpdateActor(const v1::UpdateRequest&, absl::Duration,
                   stages::StageDone<v1::UpdateReply> done) override {
    Hold(seen_.updates, "actor", std::move(done));
  }
  void UpdateCritic(const v1::UpdateRequest&, absl::Duration,
                    stages::StageDone<v1::UpdateReply> done) override {
    Hold(seen_.updates, "critic", std::move(done));
  }
  void CancelCalls() override {
    std::lock_guard<std::mutex> lock(seen_.mutex);
    cancelled_ = true;
    seen_.changed.notify_all();
  }

 private:
  template <typename Reply>
  void Hold(Gathering& group, std::string kind, stages::StageDone<Reply> done) {
    threads_.emplace_back([this, &group, kind = std::move(kind), done = std::move(done)] {
      bool cancelled = false;
      {
        std::unique_lock<std::mutex> lock(seen_.mutex);
        group.in_flight.insert(kind);
        group.most_kinds_at_once = std::max(group.most_kinds_at_once, Kinds(group.in_flight));
        group.met = group.met || Kinds(group.in_flight) >= group.meet;
        seen_.changed.notify_all();
        seen_.changed.wait_for(lock, patience_, [&] { return group.met || cancelled_; });
        group.in_flight.erase(group.in_flight.find(kind));
        cancelled = cancelled_;
      }
      if (cancelled) {
        done(absl::CancelledError("cancelled"));
      } else {
        done(Reply());
      }
    });
  }

  Seen& seen_;
  const std::chrono::milliseconds patience_;
  std::vector<std::thread> threads_;  // only the driver's threads call here, one pool each
  bool cancelled_ = false;            // guarded by seen_.mutex
};

struct AtOnce {
  size_t forwards = 0;  // the most kinds of forward in flight at once
  size_t updates = 0;   // the same of the updates
};

// Runs one PPO step (a critic, a reference and a reward model: four forwards, two updates) over
// fake ranks whose forwards wait for `meet_forwards` kinds and updates for `meet_updates`.
absl::StatusOr<AtOnce> StepOverFakes(v1::Placement placement, size_t meet_forwards,
                                     size_t meet_updates, std::chrono::milliseconds patience,
                                     std::optional<v1::ForwardKind> fails = std::nullopt) {
  v1::JobSpec spec = bench::SimulatedPpoJob("rl-step-test", 8);
  spec.set_placement(placement);
  const int world = placement == v1::PLACEMENT_SPLIT ? 8 : spec.roles().actor().gpus();
  Seen seen;
  seen.fails = fails;
  seen.forwards.meet = meet_forwards;
  seen.updates.meet = meet_updates;
  std::vector<std::unique_ptr<MeetingStages>> fakes;
  std::vector<stages::StageService*> ranks;
  for (int i = 0; i < world; ++i) {
    fakes.push_back(std::make_unique<MeetingStages>(seen, patience));
    ranks.push_back(fakes.back().get());
  }
  {
    JobStages job("job-rl-step", spec, ranks, {.stage_deadline = absl::Minutes(1)});
    REQUIRE(job.Start(1).ok());
    // After critic_warmup, so that the actor updates too.
    StepPlan plan{.step = spec.trainer().critic_warmup() + 1, .seed = 1};
    for (int p = 0; p < spec.roles().actor().gpus(); ++p) {
      v1::PromptRow row;
      row.set_text(absl::StrCat("prompt ", p));
      plan.prompts.push_back(std::move(row));
    }
    const absl::StatusOr<Metrics> metrics = job.RunStep(plan);
    job.End();
    if (!metrics.ok()) return metrics.status();
    for (const char* timing :
         {"timing_s/old_log_prob", "timing_s/ref", "timing_s/values", "timing_s/reward",
          "timing_s/update_critic", "timing_s/update_actor"}) {
      INFO(timing);
      CHECK(metrics->count(timing) == 1);
    }
  }
  fakes.clear();  // joins the fakes' threads
  return AtOnce{seen.forwards.most_kinds_at_once, seen.updates.most_kinds_at_once};
}

TEST_CASE(
    "Split pools run a PPO step's forwards at once, and its updates; colocated ones take "
    "turns",
    "[rl_step]") {
  SECTION("split: each waits until its group is in flight together (or 60 s)") {
    const absl::StatusOr<AtOnce> seen =
        StepOverFakes(v1::PLACEMENT_SPLIT, 4, 2, std::chrono::seconds(60));
    REQUIRE(seen.ok());
    CHECK(seen->forwards == 4);
    CHECK(seen->updates == 2);
  }
  SECTION("colocated: each waits 200 ms for a second of its group, which never comes") {
    const absl::StatusOr<AtOnce> seen =
        StepOverFakes(v1::PLACEMENT_COLOCATED, 2, 2, std::chrono::milliseconds(200));
    REQUIRE(seen.ok());
    CHECK(seen->forwards == 1);
    CHECK(seen->updates == 1);
  }
}

TEST_CASE("A failed forward on split pools cancels the others and ends the step with its error",
          "[rl_step]") {
  // The reference's rank fails at once; the other forwards would wait 60 s for all four kinds.
  const auto started = std::chrono::steady_clock::now();
  const absl::StatusOr<AtOnce> step = StepOverFakes(
      v1::PLACEMENT_SPLIT, 4, 2, std::chrono::seconds(60), v1::FORWARD_KIND_REF_LOG_PROBS);
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(30));
  REQUIRE_FALSE(step.ok());
  CHECK(step.status().code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(step.status().message()), Catch::Contains("this rank was lost"));
}

// The slowest rollout rank against the median (perf/straggler/gen/*), from the ranks' replies;
// a rank's figure that is not a number (a worker's defect) leaves the pair out rather than
// sorting NaN, which breaks the sort's ordering (undefined behaviour, a crash of the driver).
TEST_CASE("the straggler metrics leave out replies whose figures are not numbers", "[rl_step]") {
  std::vector<v1::GenerateReply> replies(40);
  for (size_t i = 0; i < replies.size(); ++i) {
    (*replies[i].mutable_metrics())["rollout_s"] = 2.0;
    (*replies[i].mutable_metrics())["response_tokens"] = 200.0 + 2.0 * ((i + 13) % 40);
  }
  Metrics metrics;
  AddGenerationMetrics(replies, 40, metrics);
  CHECK(metrics.at("perf/straggler/gen/rank") == 27);  // (27 + 13) % 40 = 0: 100 tokens/s.
  CHECK(metrics.at("perf/straggler/gen/ratio") == Approx(120.0 / 100.0));
  for (const double bad :
       {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    (*replies[7].mutable_metrics())["response_tokens"] = bad;
    Metrics with_bad;
    AddGenerationMetrics(replies, 40, with_bad);
    CHECK(with_bad.count("perf/straggler/gen/rank") == 0);
    CHECK(with_bad.count("perf/straggler/gen/ratio") == 0);
  }
}

// A rank whose Validate answers one score per prompt it was sent, plus `extra`.
class ScoringStages final : public bench::EmptyStages {
 public:
  explicit ScoringStages(int extra) : extra_(extra) {}
  void Validate(const v1::ValidateRequest& request, absl::Duration,
                stages::StageDone<v1::ValidateReply> done) override {
    v1::ValidateReply reply;
    for (int i = 0; i < request.prompts_size() + extra_; ++i) reply.add_scores(1.0);
    done(reply);
  }

 private:
  int extra_;
};

// The driver reads each validation score's prompt from its index; a rank that answers more
// scores than its share of prompts has would make it read past the data: the validation fails,
// naming the rank.
TEST_CASE("validation refuses a rank that answers more scores than it was sent prompts",
          "[rl_step]") {
  const v1::JobSpec spec = bench::SimulatedPpoJob("rl-step-validate", 8);  // Actors: ranks 0-3.
  std::vector<v1::PromptRow> prompts(8);
  for (int extra : {0, 3}) {
    INFO("rank 2 answers " << extra << " scores more");
    std::vector<std::unique_ptr<ScoringStages>> fakes;
    std::vector<stages::StageService*> ranks;
    for (int i = 0; i < 8; ++i) {
      fakes.push_back(std::make_unique<ScoringStages>(i == 2 ? extra : 0));
      ranks.push_back(fakes.back().get());
    }
    JobStages job("job-rl-step-validate", spec, ranks, {.stage_deadline = absl::Minutes(1)});
    REQUIRE(job.Start(1).ok());
    const absl::StatusOr<ValidationResult> validated = job.Validate(1, prompts, 7);
    job.End();
    if (extra == 0) {
      REQUIRE(validated.ok());
      CHECK(validated->scores.size() == 8);
    } else {
      REQUIRE_FALSE(validated.ok());
      CHECK(validated.status().code() == absl::StatusCode::kInternal);
      CHECK_THAT(std::string(validated.status().message()),
                 Catch::Contains("actor rank 2 answered 5 scores for 2 prompts"));
    }
  }
}

}  // namespace
}  // namespace rlhfd::controller
