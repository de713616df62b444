#include "controller/driver/rl_step.h"

#include <functional>
#include <future>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/algorithms/algorithm_traits.h"
#include "common/algorithms/on_policy.h"
#include "common/stages/response_samples.h"
#include "common/stages/step_tensors.h"
#include "common/status/status_macros.h"
#include "common/util/row_split.h"
#include "common/util/stopwatch.h"
#include "controller/cluster/pool_placement.h"
#include "controller/driver/step_metrics.h"

namespace rlhfd::controller {
namespace {

using stages::StageService;
namespace tensors = stages::tensors;

// One step's run: what it was given, what it has learnt of its batch, its metrics so far.
class StepRun {
 public:
  StepRun(const PoolCalls& pools, const v1::JobSpec& spec, const StepPlan& plan,
          OptimizerSteps& optimizer_steps)
      : pools_(pools), spec_(spec), plan_(plan), optimizer_steps_(optimizer_steps) {}

  // The step list; each line one stage group.
  absl::StatusOr<StepResult> Run(RolloutSchedule schedule) {
    const bool critic = algorithms::NeedsCritic(spec_.algorithm());
    // 1. Rollout: each actor rank generates for its share of the prompts (one_step_off: made
    // ahead, by the previous step's run, unless this is the first step run).
    std::optional<StepRollout> rollout = std::move(schedule.ahead);
    if (!rollout || rollout->step != plan_.step) {
      ASSIGN_OR_RETURN(const RolloutWeights weights,
                       SyncRolloutWeights(pools_, plan_.step, plan_.step - 1));
      ASSIGN_OR_RETURN(rollout, GenerateRollout(pools_, spec_, plan_, plan_.step - 1));
      AddRolloutWeights(weights, *rollout);
    }
    RETURN_IF_ERROR(UseRollout(*rollout));
    // one_step_off: the next step's rollout, with the weights this step starts from: first, or
    // while this step trains when the rollout runs apart. A rollout pool gets those weights
    // here, before this step trains them further.
    StepResult result;
    std::future<absl::StatusOr<StepRollout>> next;
    RolloutWeights next_weights;
    if (schedule.next != nullptr) {
      const StepPlan& next_plan = *schedule.next;
      absl::StatusOr<RolloutWeights> synced =
          SyncRolloutWeights(pools_, next_plan.step, plan_.step - 1);
      if (!synced.ok()) return WithFailedRollout(synced.status(), next_plan.step);
      next_weights = *std::move(synced);
      const auto generate_next = [&]() -> absl::StatusOr<StepRollout> {
        ASSIGN_OR_RETURN(StepRollout made,
                         GenerateRollout(pools_, spec_, next_plan, plan_.step - 1));
        AddRolloutWeights(next_weights, made);
        return made;
      };
      if (schedule.overlap) {
        next = std::async(std::launch::async, generate_next);
      } else {
        absl::StatusOr<StepRollout> made = generate_next();
        if (!made.ok()) return WithFailedRollout(made.status(), next_plan.step);
        result.next_rollout = *std::move(made);
      }
    }
    absl::Status trained = Train(critic);
    if (next.valid()) {
      // Joined whatever this step's stages came to: the call holds references to this run.
      absl::StatusOr<StepRollout> made = next.get();
      if (trained.ok() && !made.ok()) trained = WithFailedRollout(made.status(), plan_.step + 1);
      if (made.ok()) result.next_rollout = *std::move(made);
    }
    RETURN_IF_ERROR(trained);
    if (result.next_rollout) metrics_["timing_s/generate_ahead"] = result.next_rollout->seconds;
    AddTimePerToken(tokens_, metrics_);
    result.metrics = std::move(metrics_);
    result.samples = std::move(samples_);
    return result;
  }

 private:
  // 2. - 4.: the stages after the rollout.
  absl::Status Train(bool critic) {
    // trainer.mode sft: the rows are the data's conversations; the actor learns them as they are.
    if (spec_.trainer().mode() == v1::TRAINER_MODE_SFT) return Updates(false, true);
    // 2. The other pools' inputs moved to them, their forwards, and the results back.
    RETURN_IF_ERROR(Forwards(critic));
    if (spec_.roles().reward().model().empty()) RETURN_IF_ERROR(RuleRewards());
    // 3. Advantages over the whole batch, on the actor ranks.
    RETURN_IF_ERROR(Advantages());
    // 4. The updates: the critic towards the returns, the actor after critic_warmup steps.
    return Updates(critic, plan_.step > spec_.trainer().critic_warmup());
  }
  // Work of one pool that writes its figures to `metrics`.
  struct PoolWork {
    v1::Role role;
    std::function<absl::Status(Metrics& metrics)> body;
  };
  // Whether no two of `work`'s pools share a rank, so that their work can run at once (split
  // placement); colocated pools share their ranks and take turns.
  bool OnDisjointRanks(const std::vector<PoolWork>& work) const;
  // `work` at once (on disjoint ranks) or in turn; figures into the step's metrics either way.
  absl::Status AtOnceOrInTurn(const std::vector<PoolWork>& work);
  // A pool's forward over the step's sequences: what it reads from the actor ranks first, and
  // what it sends back to them after.
  struct PoolForward {
    v1::Role role;
    v1::ForwardKind kind;
    const char* stage;
    const char* timing;
    std::vector<std::string_view> inputs, outputs;
  };
  std::vector<PoolForward> PoolForwards(bool critic) const;
  absl::Status Forwards(bool critic);
  // The step's rollout as this run's: its shape and figures, and with a rollout pool its rows
  // moved to the actor ranks, which record their sources.
  absl::Status UseRollout(StepRollout& rollout);
  absl::Status RuleRewards();
  absl::Status Advantages();
  absl::Status Updates(bool critic, bool actor);
  absl::Status UpdateCritic(Metrics& metrics);
  absl::Status UpdateActor(Metrics& metrics);

  // Runs `body`, adding its time to timing_s/<name> of `metrics` (the step's by default).
  template <typename Body>
  absl::Status Timed(const char* name, Body&& body) {
    return Timed(metrics_, name, std::forward<Body>(body));
  }
  template <typename Body>
  static absl::Status Timed(Metrics& metrics, const char* name, Body&& body) {
    const Stopwatch stopwatch;
    absl::Status status = body();
    metrics[absl::StrCat("timing_s/", name)] += stopwatch.Seconds();
    return status;
  }
  // `forward`'s Forward on its pool's ranks, its figures in `metrics`.
  absl::Status Forward(const PoolForward& forward, Metrics& metrics) const;
  absl::Status Move(const std::vector<std::string_view>& tensors, v1::Role from, v1::Role to) {
    return pools_.Move(plan_.step, shape_, tensors, from, to, metrics_);
  }
  // A request of the step that names only its key.
  template <typename Request>
  std::function<Request(int, int)> Keyed(const char* stage) const {
    return [this, stage](int, int) {
      Request request;
      *request.mutable_key() = pools_.Key(plan_.step, stage);
      return request;
    };
  }

  const PoolCalls& pools_;
  const v1::JobSpec& spec_;
  const StepPlan& plan_;
  OptimizerSteps& optimizer_steps_;
  StepShape shape_;
  StepTokens tokens_;
  Metrics metrics_;
  std::vector<v1::ResponseSample> samples_;
};

// The sequences a frozen pool's forward reads.
const std::vector<std::string_view>& Sequences() {
  static const auto* sequences =
      new std::vector<std::string_view>{tensors::kInputIds, tensors::kAttentionMask};
  return *sequences;
}

// `plan`'s prompts split over `ranks` (the actor's or the rollout pool's, in data-parallel
// order): the Generate request of each position.
absl::StatusOr<std::function<v1::GenerateRequest(int, int)>> PromptShares(
    const PoolCalls& pools, const StepPlan& plan, const std::vector<int>& ranks, const char* pool,
    const char* stage) {
  const int64_t prompts = static_cast<int64_t>(plan.prompts.size());
  const int64_t dp = static_cast<int64_t>(ranks.size());
  if (prompts < 1 || prompts % dp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("step ", plan.step, ": ", prompts,
                                                   " prompts do not split evenly over the ", pool,
                                                   "'s ", dp, " ranks"));
  }
  return [&pools, &plan, prompts, dp, stage](int, int position) {
    const RowRange share = ContiguousPart(prompts, position, dp);
    v1::GenerateRequest request;
    *request.mutable_key() = pools.Key(plan.step, stage);
    for (int64_t p = share.begin; p < share.end; ++p) *request.add_prompts() = plan.prompts[p];
    request.set_first_prompt(share.begin);
    request.set_total_prompts(prompts);
    request.set_seed(plan.seed);
    return request;
  };
}

}  // namespace

absl::StatusOr<RolloutWeights> SyncRolloutWeights(const PoolCalls& pools, int64_t step,
                                                  int64_t weights_step) {
  RolloutWeights weights;
  const std::vector<int> rollout = pools.RanksOf(v1::ROLE_ROLLOUT);
  if (rollout.empty()) return weights;
  const Stopwatch stopwatch;
  std::vector<int> ranks = pools.RanksOf(v1::ROLE_ACTOR);
  ranks.insert(ranks.end(), rollout.begin(), rollout.end());
  ASSIGN_OR_RETURN(std::vector<v1::SyncWeightsReply> replies,
                   (pools.FanOut<v1::SyncWeightsRequest, v1::SyncWeightsReply>(
                       ranks, &StageService::SyncWeights, [&](int, int) {
                         v1::SyncWeightsRequest request;
                         *request.mutable_key() = pools.Key(step, "sync_weights");
                         request.set_weights_step(weights_step);
                         return request;
                       })));
  weights.replies.assign(std::make_move_iterator(replies.end() - rollout.size()),
                         std::make_move_iterator(replies.end()));
  weights.seconds = stopwatch.Seconds();
  return weights;
}

absl::StatusOr<StepRollout> GenerateRollout(const PoolCalls& pools, const v1::JobSpec& spec,
                                            const StepPlan& plan, int64_t weights_step,
                                            const std::function<void()>& before_resume) {
  const bool own_pool = !pools.RanksOf(v1::ROLE_ROLLOUT).empty();
  const std::vector<int> ranks = pools.RanksOf(own_pool ? v1::ROLE_ROLLOUT : v1::ROLE_ACTOR);
  ASSIGN_OR_RETURN(
      const auto requests,
      PromptShares(pools, plan, ranks, own_pool ? "rollout pool" : "actor", "generate"));
  const Stopwatch stopwatch;
  StepRollout rollout{.step = plan.step, .weights_step = weights_step};
  ASSIGN_OR_RETURN(rollout.replies, (pools.FanOut<v1::GenerateRequest, v1::GenerateReply>(
                                        ranks, &StageService::Generate, requests)));
  // The pool's ranks agree on whether any response is unfinished: they go on together.
  for (int resumed = 1; rollout.replies[0].unfinished() > 0; ++resumed) {
    if (before_resume) before_resume();
    const std::string stage = absl::StrCat("generate_resume_", resumed);
    ASSIGN_OR_RETURN(const auto shares,
                     PromptShares(pools, plan, ranks, "rollout pool", stage.c_str()));
    ASSIGN_OR_RETURN(rollout.replies,
                     (pools.FanOut<v1::GenerateRequest, v1::GenerateReply>(
                         ranks, &StageService::Generate, [&](int rank, int position) {
                           v1::GenerateRequest request = shares(rank, position);
                           request.set_resume(true);
                           return request;
                         })));
  }
  rollout.seconds = stopwatch.Seconds();
  return rollout;
}

void AddRolloutWeights(const RolloutWeights& weights, StepRollout& rollout) {
  for (size_t i = 0; i < weights.replies.size() && i < rollout.replies.size(); ++i) {
    auto& metrics = *rollout.replies[i].mutable_metrics();
    for (const auto& [name, value] : weights.replies[i].metrics()) {
      metrics[name == "sync_weights_s" ? "update_weights_s" : name] = value;
    }
  }
  rollout.seconds += weights.seconds;
}

absl::Status AdoptPoolRollout(const PoolCalls& pools, const v1::JobSpec& spec, const StepPlan& plan,
                              StepRollout& rollout) {
  const Stopwatch stopwatch;
  const StepShape shape{
      .rows = static_cast<int64_t>(plan.prompts.size()) * spec.roles().actor().rollout().n(),
      .prompt_length = rollout.replies[0].prompt_length(),
      .response_length = rollout.replies[0].response_length()};
  std::vector<std::string_view> moved = {tensors::kInputIds, tensors::kAttentionMask,
                                         tensors::kResponseMask, tensors::kRolloutLogProbs};
  if (spec.trainer().mode() == v1::TRAINER_MODE_ASYNC) {
    moved.push_back(tensors::kRolloutWeightsStep);
  }
  RETURN_IF_ERROR(
      pools.Move(plan.step, shape, moved, v1::ROLE_ROLLOUT, v1::ROLE_ACTOR, rollout.metrics));
  const std::vector<int> actors = pools.RanksOf(v1::ROLE_ACTOR);
  ASSIGN_OR_RETURN(auto shares, PromptShares(pools, plan, actors, "actor", "adopt_rollout"));
  const auto adopt = [&](int rank, int position) {
    v1::GenerateRequest request = shares(rank, position);
    request.set_rows_from_rollout_pool(true);
    return request;
  };
  const auto adopted =
      pools.FanOut<v1::GenerateRequest, v1::GenerateReply>(actors, &StageService::Generate, adopt);
  RETURN_IF_ERROR(adopted.status());
  rollout.metrics["timing_s/adopt_rollout"] += stopwatch.Seconds();
  rollout.adopted = true;
  return absl::OkStatus();
}

namespace {

absl::Status StepRun::UseRollout(StepRollout& rollout) {
  const std::vector<v1::GenerateReply>& generated = rollout.replies;
  const int64_t prompts = static_cast<int64_t>(plan_.prompts.size());
  shape_ = StepShape{.rows = prompts * spec_.roles().actor().rollout().n(),
                     .prompt_length = generated[0].prompt_length(),
                     .response_length = generated[0].response_length()};
  tokens_ = AddGenerationMetrics(generated, shape_.rows, metrics_);
  metrics_["timing_s/gen"] = rollout.seconds;
  if (spec_.trainer().mode() == v1::TRAINER_MODE_ONE_STEP_OFF ||
      spec_.trainer().mode() == v1::TRAINER_MODE_ASYNC) {
    // How many updates behind the weights being trained the rollout's weights are (verl's
    // trajectory staleness, in steps): 1 in one_step_off, 0 at the first step and after a resume.
    AddStalenessMetrics(generated, shape_.rows, plan_.step, rollout.weights_step, metrics_);
  }
  if (pools_.RanksOf(v1::ROLE_ROLLOUT).empty()) return absl::OkStatus();
  if (!rollout.adopted) RETURN_IF_ERROR(AdoptPoolRollout(pools_, spec_, plan_, rollout));
  for (const auto& [name, value] : rollout.metrics) metrics_[name] += value;
  return absl::OkStatus();
}

std::vector<StepRun::PoolForward> StepRun::PoolForwards(bool critic) const {
  std::vector<PoolForward> forwards;
  if (algorithms::NeedsOldLogProbs(spec_)) {
    forwards.push_back(
        {v1::ROLE_ACTOR, v1::FORWARD_KIND_OLD_LOG_PROBS, "old_log_probs", "old_log_prob", {}, {}});
  }
  if (spec_.roles().has_reference()) {
    forwards.push_back({v1::ROLE_REFERENCE,
                        v1::FORWARD_KIND_REF_LOG_PROBS,
                        "ref_log_probs",
                        "ref",
                        Sequences(),
                        {tensors::kRefLogProbs}});
  }
  if (critic) {
    forwards.push_back({v1::ROLE_CRITIC,
                        v1::FORWARD_KIND_VALUES,
                        "values",
                        "values",
                        {tensors::kInputIds, tensors::kAttentionMask, tensors::kResponseMask},
                        {tensors::kValues}});
  }
  if (!spec_.roles().reward().model().empty()) {
    forwards.push_back({v1::ROLE_REWARD,
                        v1::FORWARD_KIND_REWARD_SCORES,
                        "reward_scores",
                        "reward",
                        Sequences(),
                        {tensors::kScores}});
  }
  return forwards;
}

bool StepRun::OnDisjointRanks(const std::vector<PoolWork>& work) const {
  std::set<int> seen;
  for (const PoolWork& pool : work) {
    for (int rank : pools_.RanksOf(pool.role)) {
      if (!seen.insert(rank).second) return false;
    }
  }
  return work.size() > 1;
}

absl::Status StepRun::AtOnceOrInTurn(const std::vector<PoolWork>& work) {
  if (!OnDisjointRanks(work)) {
    for (const PoolWork& pool : work) RETURN_IF_ERROR(pool.body(metrics_));
    return absl::OkStatus();
  }
  // Each pool's figures go to a map of its own. The first failure cancels the other pools' calls:
  // the step is lost, and the run ends with that failure at once, not after the slowest pool.
  std::vector<Metrics> figures(work.size());
  std::mutex failed_mutex;
  absl::Status first_failure;
  std::vector<std::future<void>> running;
  for (size_t i = 0; i < work.size(); ++i) {
    running.push_back(std::async(std::launch::async, [&, i] {
      const absl::Status status = work[i].body(figures[i]);
      if (status.ok()) return;
      std::lock_guard<std::mutex> lock(failed_mutex);
      if (!first_failure.ok()) return;
      first_failure = status;
      for (size_t other = 0; other < work.size(); ++other) {
        if (other != i) pools_.CancelCalls(pools_.RanksOf(work[other].role));
      }
    }));
  }
  for (std::future<void>& pool : running) pool.get();
  RETURN_IF_ERROR(first_failure);
  for (const Metrics& own : figures) {
    for (const auto& [name, value] : own) {
      if (absl::StartsWith(name, "timing_s/")) {
        metrics_[name] += value;
      } else {
        metrics_[name] = value;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status StepRun::Forwards(bool critic) {
  const std::vector<PoolForward> forwards = PoolForwards(critic);
  std::vector<PoolWork> work;
  for (const PoolForward& forward : forwards) {
    work.push_back({forward.role, [&](Metrics& metrics) { return Forward(forward, metrics); }});
  }
  // The moves all involve the actor ranks, so they go before and after the forwards (a move
  // between pools that share their ranks does nothing).
  for (const PoolForward& forward : forwards) {
    if (!forward.inputs.empty()) {
      RETURN_IF_ERROR(Move(forward.inputs, v1::ROLE_ACTOR, forward.role));
    }
  }
  RETURN_IF_ERROR(AtOnceOrInTurn(work));
  for (const PoolForward& forward : forwards) {
    if (!forward.outputs.empty()) {
      RETURN_IF_ERROR(Move(forward.outputs, forward.role, v1::ROLE_ACTOR));
    }
  }
  return absl::OkStatus();
}

absl::Status StepRun::Forward(const PoolForward& forward, Metrics& metrics) const {
  const auto request = [&](int, int) {
    v1::ForwardRequest call;
    *call.mutable_key() = pools_.Key(plan_.step, forward.stage);
    call.set_kind(forward.kind);
    return call;
  };
  return Timed(metrics, forward.timing, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(const std::vector<v1::ForwardReply> replies,
                     (pools_.FanOut<v1::ForwardRequest, v1::ForwardReply>(
                         pools_.RanksOf(forward.role), &StageService::Forward, request)));
    // Figures the ranks reduced among themselves already carry verl's names (training/...).
    for (const auto& [name, value] : replies[0].metrics()) {
      if (absl::StartsWith(name, "training/")) metrics[name] = value;
    }
    return absl::OkStatus();
  });
}

// The rule's (or a remote scorer's) rewards, on the actor ranks; a reward model's come with
// the forwards.
absl::Status StepRun::RuleRewards() {
  return Timed("reward", [&]() -> absl::Status {
    return pools_
        .FanOut<v1::RewardRequest, v1::RewardReply>(pools_.RanksOf(v1::ROLE_ACTOR),
                                                    &StageService::ComputeRewards,
                                                    Keyed<v1::RewardRequest>("rewards"))
        .status();
  });
}

absl::Status StepRun::Advantages() {
  std::vector<v1::AdvantageReply> advantages;
  RETURN_IF_ERROR(Timed("adv", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(
        advantages,
        (pools_.FanOut<v1::AdvantageRequest, v1::AdvantageReply>(
            pools_.RanksOf(v1::ROLE_ACTOR), &StageService::ComputeAdvantages, [&](int, int) {
              v1::AdvantageRequest request;
              *request.mutable_key() = pools_.Key(plan_.step, "advantages");
              request.set_kl_coef(plan_.kl_coef);
              return request;
            })));
    return absl::OkStatus();
  }));
  for (const auto& [name, value] : advantages[0].metrics()) metrics_[name] = value;
  // The ranks' rows follow each other, so their samples do too.
  for (const v1::AdvantageReply& reply : advantages) {
    stages::AppendSamples(reply.samples(), spec_.trainer().log_samples(), samples_);
  }
  return absl::OkStatus();
}

// The critic's update and the actor's are independent (the actor's advantages are computed
// already), so on split pools they run at once; the returns move to the critic first.
absl::Status StepRun::Updates(bool critic, bool actor) {
  std::vector<PoolWork> work;
  if (critic) {
    RETURN_IF_ERROR(Move({tensors::kReturns}, v1::ROLE_ACTOR, v1::ROLE_CRITIC));
    work.push_back({v1::ROLE_CRITIC, [this](Metrics& metrics) { return UpdateCritic(metrics); }});
  }
  if (actor) {
    work.push_back({v1::ROLE_ACTOR, [this](Metrics& metrics) { return UpdateActor(metrics); }});
  }
  return AtOnceOrInTurn(work);
}

absl::Status StepRun::UpdateCritic(Metrics& metrics) {
  return Timed(metrics, "update_critic", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(
        const std::vector<v1::UpdateReply> updated,
        (pools_.FanOut<v1::UpdateRequest, v1::UpdateReply>(
            pools_.RanksOf(v1::ROLE_CRITIC), &StageService::UpdateCritic, [&](int, int) {
              v1::UpdateRequest request;
              *request.mutable_key() = pools_.Key(plan_.step, "update_critic");
              request.set_optimizer_steps_before(optimizer_steps_.critic);
              return request;
            })));
    AddCriticUpdateMetrics(updated, metrics);
    optimizer_steps_.critic = updated[0].optimizer_steps();
    return absl::OkStatus();
  });
}

absl::Status StepRun::UpdateActor(Metrics& metrics) {
  return Timed(metrics, "update_actor", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(const std::vector<v1::UpdateReply> updated,
                     (pools_.FanOut<v1::UpdateRequest, v1::UpdateReply>(
                         pools_.RanksOf(v1::ROLE_ACTOR), &StageService::UpdateActor, [&](int, int) {
                           v1::UpdateRequest request;
                           *request.mutable_key() = pools_.Key(plan_.step, "update_actor");
                           request.set_optimizer_steps_before(optimizer_steps_.actor);
                           return request;
                         })));
    AddActorUpdateMetrics(updated, metrics);
    optimizer_steps_.actor = updated[0].optimizer_steps();
    return absl::OkStatus();
  });
}

}  // namespace

namespace {
constexpr absl::string_view kFailedRolloutStep = "type.rlhfd.dev/failed-rollout-step";
}  // namespace

absl::Status WithFailedRollout(absl::Status status, int64_t step) {
  status.SetPayload(kFailedRolloutStep, absl::Cord(absl::StrCat(step)));
  return status;
}

std::optional<int64_t> FailedRolloutStep(const absl::Status& status) {
  const auto payload = status.GetPayload(kFailedRolloutStep);
  int64_t step = 0;
  if (!payload || !absl::SimpleAtoi(std::string(*payload), &step)) return std::nullopt;
  return step;
}

absl::StatusOr<StepResult> RunStepStages(const PoolCalls& pools, const v1::JobSpec& spec,
                                         const StepPlan& plan, OptimizerSteps& optimizer_steps,
                                         RolloutSchedule schedule) {
  return StepRun(pools, spec, plan, optimizer_steps).Run(std::move(schedule));
}

}  // namespace rlhfd::controller
