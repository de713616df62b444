// schedule_bench: what trainer.mode does to a step's time, over simulated workers whose stages
// take set durations. A PPO job with a rollout pool of its own (roles.rollout) runs through the
// driver's own JobStages; each simulated worker runs its calls in order on one executor, as a
// worker's role host does: SyncWeights (the actor's weights to the rollout pool) takes --sync_ms,
// the rollout ranks' Generate --generate_ms, UpdateActor --train_ms, every other stage answers
// at once. sync should take about sync + generate + train per step, one_step_off (the next
// step's rollout overlapping this step's training) about sync + max(generate, train), and async
// (the pool generating the next batches on the driver's AsyncRollout thread, max_staleness 1,
// whole batches: a simulated Generate is not interrupted) the same.
//   schedule_bench --generate_ms=2000 --train_ms=2000 --sync_ms=100 --steps=5
// Prints one JSON line per mode and a table.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status/status_macros.h"
#include "common/util/event_loop.h"
#include "common/util/program_setup.h"
#include "controller/driver/job_stages.h"
#include "tests/bench/empty_stages.h"
#include "tests/bench/simulated_job.h"

ABSL_FLAG(std::string, modes, "sync,one_step_off,async", "Comma-separated trainer.mode values");
ABSL_FLAG(int, generate_ms, 2000, "Generate's duration on each actor rank");
ABSL_FLAG(int, train_ms, 2000, "UpdateActor's duration on each actor rank");
ABSL_FLAG(int, sync_ms, 100, "The weight update before each Generate");
ABSL_FLAG(int, steps, 5, "Timed steps per mode (after one untimed step)");
ABSL_FLAG(int, workers, 8,
          "Simulated training workers: half actor, a quarter critic, reference, reward; and a "
          "rollout pool as large as the actor's");

namespace rlhfd {
namespace {

struct Durations {
  absl::Duration generate, train, sync;
};

// One simulated worker: its calls run in order on one executor; stages without a duration
// answer at once.
class TimedStages final : public bench::EmptyStages {
 public:
  explicit TimedStages(Durations durations) : durations_(durations) {}

  void SyncWeights(const v1::SyncWeightsRequest&, absl::Duration,
                   stages::StageDone<v1::SyncWeightsReply> done) override {
    After(durations_.sync, std::move(done));
  }
  void Generate(const v1::GenerateRequest& request, absl::Duration,
                stages::StageDone<v1::GenerateReply> done) override {
    // The actor's ranks only record the rows the rollout pool made.
    After(request.rows_from_rollout_pool() ? absl::ZeroDuration() : durations_.generate,
          std::move(done));
  }
  void UpdateActor(const v1::UpdateRequest&, absl::Duration,
                   stages::StageDone<v1::UpdateReply> done) override {
    After(durations_.train, std::move(done));
  }

 private:
  template <typename Reply>
  void After(absl::Duration duration, stages::StageDone<Reply> done) {
    executor_.Post([duration, done = std::move(done)] {
      absl::SleepFor(duration);
      done(Reply());
    });
  }

  Durations durations_;
  EventLoop executor_;
};

struct Result {
  std::string mode;
  double step_s = 0;            // the timed steps' mean
  double generate_ahead_s = 0;  // one_step_off: the next rollout's time within a step (mean)
};

controller::StepPlan Plan(int64_t step, int64_t prompts) {
  controller::StepPlan plan{.step = step, .seed = static_cast<uint64_t>(step)};
  for (int64_t p = 0; p < prompts; ++p) {
    v1::PromptRow row;
    row.set_text(absl::StrCat("prompt ", p));
    plan.prompts.push_back(std::move(row));
  }
  return plan;
}

absl::StatusOr<Result> Run(const std::string& mode_name, int workers, int steps,
                           Durations durations) {
  v1::TrainerMode mode = v1::TRAINER_MODE_UNSPECIFIED;
  if (mode_name == "sync") mode = v1::TRAINER_MODE_SYNC;
  if (mode_name == "one_step_off") mode = v1::TRAINER_MODE_ONE_STEP_OFF;
  if (mode_name == "async") mode = v1::TRAINER_MODE_ASYNC;
  if (mode == v1::TRAINER_MODE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("--modes: '", mode_name, "' is not sync, one_step_off or async"));
  }
  v1::JobSpec spec = bench::SimulatedPpoJob("schedule-bench", workers);
  spec.mutable_roles()->mutable_rollout()->set_gpus(spec.roles().actor().gpus());
  spec.mutable_trainer()->set_mode(mode);
  std::vector<std::unique_ptr<TimedStages>> simulated;
  std::vector<stages::StageService*> ranks;
  for (int i = 0; i < workers + spec.roles().rollout().gpus(); ++i) {
    simulated.push_back(std::make_unique<TimedStages>(durations));
    ranks.push_back(simulated.back().get());
  }
  controller::JobStages job("job-schedule", spec, ranks, {.stage_deadline = absl::Minutes(1)});
  RETURN_IF_ERROR(job.Start(steps + 1));
  const int64_t prompts = spec.roles().actor().gpus();
  if (mode == v1::TRAINER_MODE_ASYNC) {
    job.StartAsyncRollout([prompts](int64_t step) { return Plan(step, prompts); }, 1, steps + 1);
  }
  Result result{.mode = mode_name};
  for (int64_t step = 1; step <= steps + 1; ++step) {
    const controller::StepPlan plan = Plan(step, prompts);
    const controller::StepPlan next = Plan(step + 1, prompts);
    ASSIGN_OR_RETURN(const controller::Metrics metrics,
                     job.RunStep(plan, step <= steps ? &next : nullptr));
    if (step == 1) continue;  // the first step has no rollout made ahead
    result.step_s += metrics.at("timing_s/step") / steps;
    if (const auto ahead = metrics.find("timing_s/generate_ahead"); ahead != metrics.end()) {
      result.generate_ahead_s += ahead->second / std::max(1, steps - 1);  // all but the last
    }
  }
  job.End();
  return result;
}

int Main() {
  const Durations durations{.generate = absl::Milliseconds(absl::GetFlag(FLAGS_generate_ms)),
                            .train = absl::Milliseconds(absl::GetFlag(FLAGS_train_ms)),
                            .sync = absl::Milliseconds(absl::GetFlag(FLAGS_sync_ms))};
  const int workers = absl::GetFlag(FLAGS_workers);
  if (workers < 8 || absl::GetFlag(FLAGS_steps) < 1) {
    std::cerr << "error: --workers must be at least 8 and --steps at least 1\n";
    return 2;
  }
  std::vector<Result> results;
  for (absl::string_view mode : absl::StrSplit(absl::GetFlag(FLAGS_modes), ',')) {
    absl::StatusOr<Result> result =
        Run(std::string(mode), workers, absl::GetFlag(FLAGS_steps), durations);
    if (!result.ok()) {
      std::cerr << "error: " << result.status().message() << "\n";
      return 1;
    }
    std::cout << nlohmann::json{{"mode", result->mode},
                                {"workers", workers},
                                {"generate_ms", absl::GetFlag(FLAGS_generate_ms)},
                                {"train_ms", absl::GetFlag(FLAGS_train_ms)},
                                {"sync_ms", absl::GetFlag(FLAGS_sync_ms)},
                                {"steps", absl::GetFlag(FLAGS_steps)},
                                {"step_s", result->step_s},
                                {"generate_ahead_s", result->generate_ahead_s}}
                     .dump()
              << std::endl;
    results.push_back(*result);
  }
  std::printf("\n%14s %10s %20s\n", "mode", "step s", "next rollout s");
  for (const Result& r : results) {
    std::printf("%14s %10.3f %20.3f\n", r.mode.c_str(), r.step_s, r.generate_ahead_s);
  }
  return 0;
}

}  // namespace
}  // namespace rlhfd

int main(int argc, char** argv) {
  rlhfd::SetUpProgram();
  absl::ParseCommandLine(argc, argv);
  return rlhfd::Main();
}
