// The driver's step over stage services that answer with empty replies: which pools' forwards
// run at once. Split pools (disjoint ranks) run the old log-prob, reference, value and reward
// model forwards together; colocated pools share their ranks, and their forwards take turns. A
// forward that fails on split pools cancels the others.
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "controller/driver/job_stages.h"
#include "tests/bench/simulated_job.h"

namespace rlhfd::controller {
namespace {

// What the fake ranks saw of the forwards: the kinds in flight at once, at most. A forward of
// kind `fails` fails at once.
struct ForwardsSeen {
  std::optional<v1::ForwardKind> fails;
  std::mutex mutex;
  std::condition_variable changed;
  std::multiset<v1::ForwardKind> in_flight;
  size_t most_kinds_at_once = 0;
  bool met = false;  // the kinds were in flight together once: later calls need not wait
};

size_t Kinds(const std::multiset<v1::ForwardKind>& in_flight) {
  return std::set<v1::ForwardKind>(in_flight.begin(), in_flight.end()).size();
}

// A rank whose stages answer at once, except Forward, which answers on a thread of its own once
// `meet` kinds of forward have been in flight together, or after `patience`.
class MeetingStages final : public stages::StageService {
 public:
  MeetingStages(ForwardsSeen& seen, size_t meet, std::chrono::milliseconds patience)
      : seen_(seen), meet_(meet), patience_(patience) {}
  ~MeetingStages() override {
    for (std::thread& thread : threads_) thread.join();
  }

  void Forward(const v1::ForwardRequest& request, absl::Duration,
               stages::StageDone<v1::ForwardReply> done) override {
    const v1::ForwardKind kind = request.kind();
    threads_.emplace_back([this, kind, done = std::move(done)] {
      bool cancelled = false;
      {
        std::unique_lock<std::mutex> lock(seen_.mutex);
        if (seen_.fails == kind) {
          lock.unlock();
          done(absl::UnavailableError("this rank was lost"));
          return;
        }
        seen_.in_flight.insert(kind);
        seen_.most_kinds_at_once = std::max(seen_.most_kinds_at_once, Kinds(seen_.in_flight));
        seen_.met = seen_.met || Kinds(seen_.in_flight) >= meet_;
        seen_.changed.notify_all();
        seen_.changed.wait_for(lock, patience_, [&] { return seen_.met || cancelled_; });
        seen_.in_flight.erase(seen_.in_flight.find(kind));
        cancelled = cancelled_;
      }
      if (cancelled) {
        done(absl::CancelledError("cancelled"));
      } else {
        done(v1::ForwardReply());
      }
    });
  }
  void CancelCalls() override {
    std::lock_guard<std::mutex> lock(seen_.mutex);
    cancelled_ = true;
    seen_.changed.notify_all();
  }
#define RLHFD_AT_ONCE(Name, Request, Reply)                                                   \
  void Name(const v1::Request&, absl::Duration, stages::StageDone<v1::Reply> done) override { \
    done(v1::Reply());                                                                        \
  }
  RLHFD_AT_ONCE(PrepareJob, PrepareJobRequest, PrepareJobReply)
  RLHFD_AT_ONCE(StartJob, StartJobRequest, StartJobReply)
  RLHFD_AT_ONCE(Generate, GenerateRequest, GenerateReply)
  RLHFD_AT_ONCE(MoveTensors, MoveTensorsRequest, MoveTensorsReply)
  RLHFD_AT_ONCE(ComputeRewards, RewardRequest, RewardReply)
  RLHFD_AT_ONCE(ComputeAdvantages, AdvantageRequest, AdvantageReply)
  RLHFD_AT_ONCE(UpdateActor, UpdateRequest, UpdateReply)
  RLHFD_AT_ONCE(UpdateCritic, UpdateRequest, UpdateReply)
  RLHFD_AT_ONCE(Validate, ValidateRequest, ValidateReply)
  RLHFD_AT_ONCE(SaveCheckpoint, CheckpointRequest, CheckpointReply)
  RLHFD_AT_ONCE(CommitCheckpoint, CheckpointRequest, CheckpointReply)
  RLHFD_AT_ONCE(LoadCheckpoint, CheckpointRequest, CheckpointReply)
  RLHFD_AT_ONCE(Offload, OffloadRequest, OffloadReply)
  RLHFD_AT_ONCE(DumpBatch, DumpBatchRequest, DumpBatchReply)
  RLHFD_AT_ONCE(MeasurePrompts, MeasurePromptsRequest, MeasurePromptsReply)
  RLHFD_AT_ONCE(EndJob, EndJobRequest, EndJobReply)
#undef RLHFD_AT_ONCE

 private:
  ForwardsSeen& seen_;
  const size_t meet_;
  const std::chrono::milliseconds patience_;
  std::vector<std::thread> threads_;  // only the driver's threads call Forward, one pool each
  bool cancelled_ = false;            // guarded by seen_.mutex
};

// Runs one PPO step (a critic, a reference and a reward model: four forwards) over `world`
// fake ranks; the most kinds of forward in flight at once, or the step's failure.
absl::StatusOr<size_t> MostForwardsAtOnce(v1::Placement placement, size_t meet,
                                          std::chrono::milliseconds patience,
                                          std::optional<v1::ForwardKind> fails = std::nullopt) {
  v1::JobSpec spec = bench::SimulatedPpoJob("rl-step-test", 8);
  spec.set_placement(placement);
  const int world = placement == v1::PLACEMENT_SPLIT ? 8 : spec.roles().actor().gpus();
  ForwardsSeen seen;
  seen.fails = fails;
  std::vector<std::unique_ptr<MeetingStages>> fakes;
  std::vector<stages::StageService*> ranks;
  for (int i = 0; i < world; ++i) {
    fakes.push_back(std::make_unique<MeetingStages>(seen, meet, patience));
    ranks.push_back(fakes.back().get());
  }
  {
    JobStages job("job-rl-step", spec, ranks, {.stage_deadline = absl::Minutes(1)});
    REQUIRE(job.Start(1).ok());
    StepPlan plan{.step = 1, .seed = 1};
    for (int p = 0; p < spec.roles().actor().gpus(); ++p) {
      v1::PromptRow row;
      row.set_text(absl::StrCat("prompt ", p));
      plan.prompts.push_back(std::move(row));
    }
    const absl::StatusOr<Metrics> metrics = job.RunStep(plan);
    job.End();
    if (!metrics.ok()) return metrics.status();
    for (const char* timing :
         {"timing_s/old_log_prob", "timing_s/ref", "timing_s/values", "timing_s/reward"}) {
      INFO(timing);
      CHECK(metrics->count(timing) == 1);
    }
  }
  fakes.clear();  // joins the forwards' threads
  return seen.most_kinds_at_once;
}

TEST_CASE("Split pools run the four forwards of a PPO step at once; colocated ones take turns",
          "[rl_step]") {
  SECTION("split: every forward waits until all four are in flight (or 60 s)") {
    CHECK(MostForwardsAtOnce(v1::PLACEMENT_SPLIT, 4, std::chrono::seconds(60)).value() == 4);
  }
  SECTION("colocated: a forward waits 200 ms for a second one, which never comes") {
    CHECK(MostForwardsAtOnce(v1::PLACEMENT_COLOCATED, 2, std::chrono::milliseconds(200)).value() ==
          1);
  }
}

TEST_CASE("A failed forward on split pools cancels the others and ends the step with its error",
          "[rl_step]") {
  // The reference's rank fails at once; the other forwards would wait 60 s for all four kinds.
  const auto started = std::chrono::steady_clock::now();
  const absl::StatusOr<size_t> step = MostForwardsAtOnce(
      v1::PLACEMENT_SPLIT, 4, std::chrono::seconds(60), v1::FORWARD_KIND_REF_LOG_PROBS);
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(30));
  REQUIRE_FALSE(step.ok());
  CHECK(step.status().code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(step.status().message()), Catch::Contains("this rank was lost"));
}

}  // namespace
}  // namespace rlhfd::controller
