#include "common/roles/job_stages.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging/logging.h"
#include "common/roles/on_policy.h"
#include "common/roles/pool_placement.h"
#include "common/status/status_macros.h"
#include "common/util/row_split.h"

namespace rlhfd::roles {

using stages::StageDone;
using stages::StageService;

namespace {

constexpr char kActor[] = "actor";
constexpr char kCritic[] = "critic";
constexpr char kReference[] = "reference";
constexpr char kReward[] = "reward";

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// verl's names for the update metrics.
const std::map<std::string, std::string>& ActorMetricNames() {
  static const auto* names =
      new std::map<std::string, std::string>{{"policy_loss", "actor/pg_loss"},
                                             {"kl_loss", "actor/kl_loss"},
                                             {"clip_fraction", "actor/pg_clipfrac"},
                                             {"clip_fraction_low", "actor/pg_clipfrac_lower"},
                                             {"approx_kl", "actor/ppo_kl"},
                                             {"entropy", "actor/entropy"},
                                             {"grad_norm", "actor/grad_norm"},
                                             {"lr", "actor/lr"},
                                             {"nonfinite_skips", "actor/nonfinite_skips"},
                                             {"response_tokens_per_s", "actor/tokens_per_s"}};
  return *names;
}

const std::map<std::string, std::string>& CriticMetricNames() {
  static const auto* names =
      new std::map<std::string, std::string>{{"value_loss", "critic/vf_loss"},
                                             {"value_clip_fraction", "critic/vf_clipfrac"},
                                             {"values", "critic/vpred_mean"},
                                             {"explained_variance", "critic/vf_explained_var"},
                                             {"grad_norm", "critic/grad_norm"},
                                             {"lr", "critic/lr"},
                                             {"nonfinite_skips", "critic/nonfinite_skips"}};
  return *names;
}

void AddRenamed(const google::protobuf::Map<std::string, double>& from,
                const std::map<std::string, std::string>& names, Metrics& to) {
  for (const auto& [name, value] : from) {
    const auto renamed = names.find(name);
    if (renamed != names.end()) to[renamed->second] = value;
  }
}

// The largest of the replies' `name` metric; none when no reply has it (a GPU-only figure on
// CPU workers).
template <typename Reply>
std::optional<double> Largest(const std::vector<Reply>& replies, const std::string& name) {
  std::optional<double> largest;
  for (const Reply& reply : replies) {
    const auto found = reply.metrics().find(name);
    if (found != reply.metrics().end())
      largest = std::max(largest.value_or(found->second), found->second);
  }
  return largest;
}

}  // namespace

JobStages::JobStages(std::string job_id, v1::JobSpec spec, std::vector<StageService*> ranks,
                     JobStagesOptions options)
    : job_id_(std::move(job_id)),
      spec_(std::move(spec)),
      ranks_(std::move(ranks)),
      options_(options),
      pools_(PlacePools(spec_)) {}

std::vector<int> JobStages::RanksOf(const std::string& role) const {
  const v1::PoolAssignment* pool = FindPool(pools_, role);
  if (pool == nullptr) return {};
  return std::vector<int>(pool->ranks().begin(), pool->ranks().end());
}

v1::StageKey JobStages::Key(int64_t step, const std::string& stage) const {
  v1::StageKey key;
  key.set_job_id(job_id_);
  key.set_step(step);
  key.set_stage(stage);
  key.set_attempt(options_.attempt);
  return key;
}

template <typename Request, typename Reply>
absl::StatusOr<std::vector<Reply>> JobStages::FanOut(
    const std::vector<int>& ranks,
    void (StageService::*method)(const Request&, absl::Duration, StageDone<Reply>),
    const std::function<Request(int rank, int position)>& make, absl::Duration deadline) {
  // Outlives this call: replies that come after a failure land here and are dropped.
  struct Gather {
    std::mutex mutex;
    std::condition_variable done;
    size_t left = 0;
    std::optional<size_t> failed;  // the first rank (position) whose call failed
    std::vector<absl::StatusOr<Reply>> replies;
  };
  auto gather = std::make_shared<Gather>();
  gather->left = ranks.size();
  gather->replies.resize(ranks.size(), absl::UnknownError("no reply"));
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int rank = ranks[i];
    if (rank < 0 || rank >= static_cast<int>(ranks_.size())) {
      return absl::InternalError(absl::StrCat("rank ", rank, " is outside the job's world"));
    }
    (ranks_[rank]->*method)(make(rank, static_cast<int>(i)), deadline,
                            [gather, i](absl::StatusOr<Reply> reply) {
                              std::lock_guard<std::mutex> lock(gather->mutex);
                              if (!reply.ok() && !gather->failed) gather->failed = i;
                              gather->replies[i] = std::move(reply);
                              if (--gather->left == 0 || gather->failed) {
                                gather->done.notify_all();
                              }
                            });
  }
  // The first failure ends the fan-out: the other ranks may be waiting in a collective for the
  // failed one, and would hold the step until the collective timeout. Ending the attempt
  // (EndJob, which the driver sends next) interrupts them.
  std::unique_lock<std::mutex> lock(gather->mutex);
  gather->done.wait(lock, [&] { return gather->left == 0 || gather->failed.has_value(); });
  if (gather->failed) {
    const size_t i = *gather->failed;
    const absl::Status& status = gather->replies[i].status();
    return absl::Status(status.code(), absl::StrCat("rank ", ranks[i], ": ", status.message()));
  }
  std::vector<Reply> replies;
  for (size_t i = 0; i < ranks.size(); ++i) replies.push_back(*std::move(gather->replies[i]));
  return replies;
}

absl::Status JobStages::Start(int64_t total_steps) {
  const int world = WorldSize(pools_);
  if (world != static_cast<int>(ranks_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job's pools span ", world, " ranks and it was given ", ranks_.size(), " workers"));
  }
  v1::PrepareJobRequest prepare;
  prepare.set_job_id(job_id_);
  prepare.set_world_size(world);
  prepare.set_nccl(options_.nccl);
  prepare.set_attempt(options_.attempt);
  ASSIGN_OR_RETURN(const std::vector<v1::PrepareJobReply> prepared,
                   (FanOut<v1::PrepareJobRequest, v1::PrepareJobReply>(
                       {0}, &StageService::PrepareJob, [&](int, int) { return prepare; },
                       options_.stage_deadline)));
  std::vector<int> everyone(world);
  for (int r = 0; r < world; ++r) everyone[r] = r;
  return FanOut<v1::StartJobRequest, v1::StartJobReply>(
             everyone, &StageService::StartJob,
             [&](int rank, int) {
               v1::StartJobRequest start;
               start.set_job_id(job_id_);
               *start.mutable_spec() = spec_;
               start.set_world_size(world);
               start.set_rank(rank);
               for (const v1::PoolAssignment& pool : pools_) *start.add_pools() = pool;
               *start.mutable_bootstrap() = prepared[0].bootstrap();
               start.set_communicator_timeout_ms(options_.communicator_timeout_ms);
               start.set_total_steps(total_steps);
               start.set_attempt(options_.attempt);
               return start;
             },
             options_.start_deadline)
      .status();
}

absl::Status JobStages::Move(int64_t step, const std::vector<std::string>& tensors,
                             const std::string& from, const std::string& to, Metrics& metrics) {
  const std::vector<int> sources = RanksOf(from), destinations = RanksOf(to);
  if (sources.empty() || destinations.empty() || sources == destinations) return absl::OkStatus();
  std::vector<int> involved = sources;
  for (int rank : destinations) {
    if (std::find(involved.begin(), involved.end(), rank) == involved.end())
      involved.push_back(rank);
  }
  const std::string stage = absl::StrCat("move ", absl::StrJoin(tensors, ","), " ", from, ">", to);
  ASSIGN_OR_RETURN(const std::vector<v1::MoveTensorsReply> replies,
                   (FanOut<v1::MoveTensorsRequest, v1::MoveTensorsReply>(
                       involved, &StageService::MoveTensors,
                       [&](int, int) {
                         v1::MoveTensorsRequest move;
                         *move.mutable_key() = Key(step, stage);
                         for (const std::string& name : tensors) move.add_tensors(name);
                         move.set_from_role(from);
                         move.set_to_role(to);
                         move.set_rows(total_rows_);
                         move.set_prompt_length(static_cast<int32_t>(prompt_length_));
                         move.set_response_length(static_cast<int32_t>(response_length_));
                         return move;
                       },
                       options_.stage_deadline)));
  for (const v1::MoveTensorsReply& reply : replies) {
    metrics["perf/moved_bytes"] += static_cast<double>(reply.bytes_sent());
  }
  return absl::OkStatus();
}

absl::StatusOr<Metrics> JobStages::RunStep(const StepPlan& plan) {
  const auto step_start = std::chrono::steady_clock::now();
  const int64_t step = plan.step;
  const int64_t n = spec_.roles().actor().rollout().n();
  const int64_t prompts = static_cast<int64_t>(plan.prompts.size());
  const std::vector<int> actors = RanksOf(kActor);
  const int64_t dp = static_cast<int64_t>(actors.size());
  if (prompts < 1 || prompts % dp != 0) {
    return absl::InvalidArgumentError(absl::StrCat("step ", step, ": ", prompts,
                                                   " prompts do not split evenly over the actor's ",
                                                   dp, " ranks"));
  }
  Metrics metrics;
  const auto timed = [&](const char* name, auto&& run) -> absl::Status {
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = run();
    metrics[absl::StrCat("timing_s/", name)] += SecondsSince(start);
    return status;
  };

  // 1. Rollout: each actor rank its share of the prompts.
  std::vector<v1::GenerateReply> generated;
  RETURN_IF_ERROR(timed("gen", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(generated, (FanOut<v1::GenerateRequest, v1::GenerateReply>(
                                    actors, &StageService::Generate,
                                    [&](int, int position) {
                                      const RowRange share = ContiguousPart(prompts, position, dp);
                                      v1::GenerateRequest request;
                                      *request.mutable_key() = Key(step, "generate");
                                      for (int64_t p = share.begin; p < share.end; ++p) {
                                        *request.add_prompts() = plan.prompts[p];
                                      }
                                      request.set_first_prompt(share.begin);
                                      request.set_total_prompts(prompts);
                                      request.set_seed(plan.seed);
                                      return request;
                                    },
                                    options_.stage_deadline)));
    return absl::OkStatus();
  }));
  // Bringing the rollout's weights up to date is part of generating; verl times it apart.
  metrics["timing_s/update_weights"] = Largest(generated, "update_weights_s").value_or(0.0);
  total_rows_ = prompts * n;
  prompt_length_ = generated[0].prompt_length();
  response_length_ = generated[0].response_length();
  double response_tokens = 0, longest = 0, shortest = 1e18, truncated = 0, prompt_tokens = 0;
  double longest_prompt = 0, shortest_prompt = 1e18;
  for (const v1::GenerateReply& reply : generated) {
    for (const v1::RowInfo& row : reply.rows()) {
      longest_prompt = std::max<double>(longest_prompt, row.prompt_tokens());
      shortest_prompt = std::min<double>(shortest_prompt, row.prompt_tokens());
      response_tokens += row.response_tokens();
      prompt_tokens += row.prompt_tokens();
      longest = std::max<double>(longest, row.response_tokens());
      shortest = std::min<double>(shortest, row.response_tokens());
      truncated += row.truncated() ? 1 : 0;
    }
  }
  const double rows = static_cast<double>(total_rows_);
  metrics["response_length/mean"] = response_tokens / rows;
  metrics["response_length/max"] = longest;
  metrics["response_length/min"] = shortest;
  metrics["response_length/clip_ratio"] = truncated / rows;
  metrics["prompt_length/mean"] = prompt_tokens / rows;
  metrics["prompt_length/max"] = longest_prompt;
  metrics["prompt_length/min"] = shortest_prompt;

  const v1::AlgorithmSpec& algorithm = spec_.algorithm();
  const bool gae = algorithm.adv_estimator() == v1::ADVANTAGE_ESTIMATOR_GAE;
  const bool needs_reference = spec_.roles().has_reference();
  const bool reward_model = !spec_.roles().reward().model().empty();
  const std::vector<std::string> sequences = {"input_ids", "attention_mask"};

  // 2. Everyone else's inputs, then the forwards.
  const auto forward = [&](const std::string& role, v1::ForwardKind kind, const char* stage,
                           const char* timing) -> absl::Status {
    return timed(timing, [&]() -> absl::Status {
      return FanOut<v1::ForwardRequest, v1::ForwardReply>(
                 RanksOf(role), &StageService::Forward,
                 [&](int, int) {
                   v1::ForwardRequest request;
                   *request.mutable_key() = Key(step, stage);
                   request.set_kind(kind);
                   return request;
                 },
                 options_.stage_deadline)
          .status();
    });
  };
  if (NeedsOldLogProbs(spec_)) {
    RETURN_IF_ERROR(
        forward(kActor, v1::FORWARD_KIND_OLD_LOG_PROBS, "old_log_probs", "old_log_prob"));
  }
  if (needs_reference) {
    RETURN_IF_ERROR(Move(step, sequences, kActor, kReference, metrics));
    RETURN_IF_ERROR(forward(kReference, v1::FORWARD_KIND_REF_LOG_PROBS, "ref_log_probs", "ref"));
    RETURN_IF_ERROR(Move(step, {"ref_log_probs"}, kReference, kActor, metrics));
  }
  if (gae) {
    RETURN_IF_ERROR(
        Move(step, {"input_ids", "attention_mask", "response_mask"}, kActor, kCritic, metrics));
    RETURN_IF_ERROR(forward(kCritic, v1::FORWARD_KIND_VALUES, "values", "values"));
    RETURN_IF_ERROR(Move(step, {"values"}, kCritic, kActor, metrics));
  }
  if (reward_model) {
    RETURN_IF_ERROR(Move(step, sequences, kActor, kReward, metrics));
    RETURN_IF_ERROR(forward(kReward, v1::FORWARD_KIND_REWARD_SCORES, "reward_scores", "reward"));
    RETURN_IF_ERROR(Move(step, {"scores"}, kReward, kActor, metrics));
  } else {
    RETURN_IF_ERROR(timed("reward", [&]() -> absl::Status {
      return FanOut<v1::RewardRequest, v1::RewardReply>(
                 actors, &StageService::ComputeRewards,
                 [&](int, int) {
                   v1::RewardRequest request;
                   *request.mutable_key() = Key(step, "rewards");
                   return request;
                 },
                 options_.stage_deadline)
          .status();
    }));
  }

  // 3. Advantages over the whole batch, on the actor ranks.
  std::vector<v1::AdvantageReply> advantages;
  RETURN_IF_ERROR(timed("adv", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(advantages, (FanOut<v1::AdvantageRequest, v1::AdvantageReply>(
                                     actors, &StageService::ComputeAdvantages,
                                     [&](int, int) {
                                       v1::AdvantageRequest request;
                                       *request.mutable_key() = Key(step, "advantages");
                                       request.set_kl_coef(plan.kl_coef);
                                       return request;
                                     },
                                     options_.stage_deadline)));
    return absl::OkStatus();
  }));
  for (const auto& [name, value] : advantages[0].metrics()) metrics[name] = value;

  // 4. The updates: the critic towards the returns, the actor after critic_warmup steps.
  if (gae) {
    RETURN_IF_ERROR(Move(step, {"returns"}, kActor, kCritic, metrics));
    RETURN_IF_ERROR(timed("update_critic", [&]() -> absl::Status {
      ASSIGN_OR_RETURN(const std::vector<v1::UpdateReply> updated,
                       (FanOut<v1::UpdateRequest, v1::UpdateReply>(
                           RanksOf(kCritic), &StageService::UpdateCritic,
                           [&](int, int) {
                             v1::UpdateRequest request;
                             *request.mutable_key() = Key(step, "update_critic");
                             request.set_optimizer_steps_before(critic_optimizer_steps_);
                             return request;
                           },
                           options_.stage_deadline)));
      AddRenamed(updated[0].metrics(), CriticMetricNames(), metrics);
      critic_optimizer_steps_ = updated[0].optimizer_steps();
      return absl::OkStatus();
    }));
  }
  if (step > spec_.trainer().critic_warmup()) {
    RETURN_IF_ERROR(timed("update_actor", [&]() -> absl::Status {
      ASSIGN_OR_RETURN(const std::vector<v1::UpdateReply> updated,
                       (FanOut<v1::UpdateRequest, v1::UpdateReply>(
                           actors, &StageService::UpdateActor,
                           [&](int, int) {
                             v1::UpdateRequest request;
                             *request.mutable_key() = Key(step, "update_actor");
                             request.set_optimizer_steps_before(actor_optimizer_steps_);
                             return request;
                           },
                           options_.stage_deadline)));
      AddRenamed(updated[0].metrics(), ActorMetricNames(), metrics);
      // verl's MFU is the batch's FLOPs over the time, the peak and the world: the ranks' mean.
      double mfu = 0;
      for (const v1::UpdateReply& reply : updated) {
        const auto found = reply.metrics().find("mfu");
        if (found != reply.metrics().end()) mfu += found->second;
      }
      metrics["perf/mfu/actor"] = mfu / static_cast<double>(updated.size());
      for (const char* memory : {"max_memory_allocated_gb", "max_memory_reserved_gb"}) {
        if (const std::optional<double> peak = Largest(updated, memory)) {
          metrics[absl::StrCat("perf/", memory)] = *peak;
        }
      }
      actor_optimizer_steps_ = updated[0].optimizer_steps();
      return absl::OkStatus();
    }));
  }
  const double seconds = SecondsSince(step_start);
  metrics["timing_s/step"] = seconds;
  metrics["perf/time_per_step"] = seconds;
  metrics["perf/total_num_tokens"] = response_tokens + prompt_tokens;
  // verl's timing_per_token_ms: generation per response token, every other stage per token of
  // the batch (prompts and responses).
  const double all_tokens = std::max(1.0, response_tokens + prompt_tokens);
  for (const char* stage :
       {"gen", "old_log_prob", "ref", "values", "reward", "adv", "update_critic", "update_actor"}) {
    const auto timed_stage = metrics.find(absl::StrCat("timing_s/", stage));
    if (timed_stage == metrics.end()) continue;
    const double tokens =
        std::string_view(stage) == "gen" ? std::max(1.0, response_tokens) : all_tokens;
    metrics[absl::StrCat("timing_per_token_ms/", stage)] = timed_stage->second * 1000 / tokens;
  }
  metrics["perf/throughput"] = (response_tokens + prompt_tokens) / std::max(seconds, 1e-9) /
                               static_cast<double>(ranks_.size());
  return metrics;
}

absl::StatusOr<ValidationResult> JobStages::Validate(int64_t step,
                                                     const std::vector<v1::PromptRow>& prompts,
                                                     uint64_t seed) {
  const std::vector<int> actors = RanksOf(kActor);
  const int64_t count = static_cast<int64_t>(prompts.size());
  const int64_t dp = static_cast<int64_t>(actors.size());
  ASSIGN_OR_RETURN(const std::vector<v1::ValidateReply> replies,
                   (FanOut<v1::ValidateRequest, v1::ValidateReply>(
                       actors, &StageService::Validate,
                       [&](int, int position) {
                         const RowRange share = ContiguousPart(count, position, dp);
                         v1::ValidateRequest request;
                         // Validation before step 1 and after step 1 are different calls.
                         *request.mutable_key() =
                             Key(std::max<int64_t>(step, 1), absl::StrCat("validate after ", step));
                         for (int64_t p = share.begin; p < share.end; ++p) {
                           *request.add_prompts() = prompts[p];
                         }
                         request.set_first_prompt(share.begin);
                         request.set_seed(seed);
                         return request;
                       },
                       options_.stage_deadline)));
  ValidationResult result;
  double tokens = 0;
  for (const v1::ValidateReply& reply : replies) {
    result.scores.insert(result.scores.end(), reply.scores().begin(), reply.scores().end());
    result.responses.insert(result.responses.end(), reply.responses().begin(),
                            reply.responses().end());
    for (const v1::RowInfo& row : reply.rows()) tokens += row.response_tokens();
  }
  double total = 0;
  for (double score : result.scores) total += score;
  const double responses = std::max<double>(1, static_cast<double>(result.scores.size()));
  result.metrics["val/score/mean"] = total / responses;
  result.metrics["val/response_length/mean"] = tokens / responses;
  return result;
}

absl::Status JobStages::SaveCheckpoint(int64_t step, bool export_huggingface, double kl_coef) {
  std::vector<int> everyone(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) everyone[r] = static_cast<int>(r);
  const auto request = [&](const char* stage) {
    v1::CheckpointRequest save;
    *save.mutable_key() = Key(step, stage);
    save.set_directory(spec_.trainer().checkpoint_dir());
    save.set_step(step);
    save.set_export_huggingface(export_huggingface);
    save.set_kl_coef(kl_coef);
    return save;
  };
  RETURN_IF_ERROR((FanOut<v1::CheckpointRequest, v1::CheckpointReply>(
                       everyone, &StageService::SaveCheckpoint,
                       [&](int, int) { return request("save"); }, options_.stage_deadline)
                       .status()));
  // Only once every rank has saved does `latest` move.
  return FanOut<v1::CheckpointRequest, v1::CheckpointReply>(
             {0}, &StageService::CommitCheckpoint, [&](int, int) { return request("commit"); },
             options_.stage_deadline)
      .status();
}

absl::StatusOr<int64_t> JobStages::LoadCheckpoint(int64_t step) {
  const std::string& directory = spec_.trainer().checkpoint_dir();
  std::vector<int> everyone(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) everyone[r] = static_cast<int>(r);
  passed_over_.clear();
  std::vector<v1::CheckpointReply> loaded;
  // Each rank checks only its own files, so one may find a step intact that another passes
  // over; then every rank loads the older step, until all agree. The step asked for falls each
  // round, so this ends.
  for (int64_t want = step;;) {
    absl::StatusOr<std::vector<v1::CheckpointReply>> round =
        FanOut<v1::CheckpointRequest, v1::CheckpointReply>(
            everyone, &StageService::LoadCheckpoint,
            [&](int, int) {
              v1::CheckpointRequest load;
              *load.mutable_key() = Key(std::max<int64_t>(want, 1), "load");
              load.set_directory(directory);
              load.set_step(want);
              return load;
            },
            options_.stage_deadline);
    if (!round.ok()) {
      // No step is intact for one rank: the files other ranks found bad in earlier rounds are
      // named too, so the message lists every bad file.
      std::vector<std::string> others;
      for (const std::string& note : passed_over_) {
        if (!absl::StrContains(round.status().message(), note)) others.push_back(note);
      }
      if (!absl::IsDataLoss(round.status()) || others.empty()) return round.status();
      return absl::DataLossError(absl::StrCat(round.status().message(),
                                              " Other ranks passed over: ",
                                              absl::StrJoin(others, "; ")));
    }
    loaded = *std::move(round);
    int64_t oldest = loaded[0].step();
    for (size_t r = 0; r < loaded.size(); ++r) {
      const v1::CheckpointReply& reply = loaded[r];
      if (reply.step() < 1 || (want > 0 && reply.step() > want)) {
        return absl::DataLossError(absl::StrCat("rank ", r, " loaded step ", reply.step(), " from ",
                                                directory, " when asked for step ", want,
                                                " or before"));
      }
      oldest = std::min(oldest, reply.step());
      for (const std::string& note : reply.passed_over()) {
        if (std::find(passed_over_.begin(), passed_over_.end(), note) == passed_over_.end()) {
          passed_over_.push_back(note);
        }
      }
    }
    const bool agreed = std::all_of(loaded.begin(), loaded.end(),
                                    [&](const auto& reply) { return reply.step() == oldest; });
    if (agreed) break;
    want = oldest;
  }
  actor_optimizer_steps_ = critic_optimizer_steps_ = 0;
  for (const v1::CheckpointReply& reply : loaded) {
    actor_optimizer_steps_ = std::max(actor_optimizer_steps_, reply.optimizer_steps());
    critic_optimizer_steps_ = std::max(critic_optimizer_steps_, reply.critic_optimizer_steps());
  }
  loaded_kl_coef_ = loaded[0].kl_coef();
  return loaded[0].step();
}

absl::StatusOr<std::vector<std::string>> JobStages::DumpBatch(int64_t step) {
  std::vector<int> everyone(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) everyone[r] = static_cast<int>(r);
  ASSIGN_OR_RETURN(const std::vector<v1::DumpBatchReply> dumped,
                   (FanOut<v1::DumpBatchRequest, v1::DumpBatchReply>(
                       everyone, &StageService::DumpBatch,
                       [&](int, int) {
                         v1::DumpBatchRequest request;
                         *request.mutable_key() = Key(step, "dump");
                         request.set_directory(spec_.trainer().rollout_data_dir());
                         return request;
                       },
                       options_.stage_deadline)));
  std::vector<std::string> paths;
  for (const v1::DumpBatchReply& reply : dumped) paths.push_back(reply.path());
  return paths;
}

absl::StatusOr<std::vector<int64_t>> JobStages::MeasurePrompts(
    const std::vector<v1::PromptRow>& prompts) {
  // Chunks under a worker's 4 MiB request limit, whatever the rows' sizes: only the prompt of a
  // row travels, and a row is at most 1 MiB (the data loader's limit), so one always fits.
  constexpr int64_t kChunkRows = 512;
  constexpr int64_t kChunkBytes = 3 << 20;
  std::vector<int64_t> tokens;
  tokens.reserve(prompts.size());
  const int64_t total = static_cast<int64_t>(prompts.size());
  for (int64_t first = 0, end = 0; first < total; first = end) {
    v1::MeasurePromptsRequest request;
    *request.mutable_key() = Key(1, absl::StrCat("measure ", first));
    *request.mutable_spec() = spec_;
    request.set_first_prompt(first);
    int64_t bytes = 0;
    for (end = first; end < total && end - first < kChunkRows; ++end) {
      v1::PromptRow prompt = prompts[end];
      prompt.clear_ground_truth_json();
      const int64_t size = static_cast<int64_t>(prompt.ByteSizeLong());
      if (end > first && bytes + size > kChunkBytes) break;
      bytes += size;
      *request.add_prompts() = std::move(prompt);
    }
    ASSIGN_OR_RETURN(const std::vector<v1::MeasurePromptsReply> measured,
                     (FanOut<v1::MeasurePromptsRequest, v1::MeasurePromptsReply>(
                         {0}, &StageService::MeasurePrompts, [&](int, int) { return request; },
                         options_.stage_deadline)));
    if (measured[0].tokens_size() != end - first) {
      return absl::InternalError(absl::StrCat("rank 0 measured ", measured[0].tokens_size(), " of ",
                                              end - first, " prompts"));
    }
    tokens.insert(tokens.end(), measured[0].tokens().begin(), measured[0].tokens().end());
  }
  return tokens;
}

void JobStages::End(absl::Duration deadline) {
  std::vector<int> everyone(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) everyone[r] = static_cast<int>(r);
  absl::Status ended = FanOut<v1::EndJobRequest, v1::EndJobReply>(
                           everyone, &StageService::EndJob,
                           [&](int, int) {
                             v1::EndJobRequest request;
                             request.set_job_id(job_id_);
                             request.set_attempt(options_.attempt);
                             return request;
                           },
                           deadline)
                           .status();
  if (!ended.ok()) RLOG(WARNING) << "ending job " << job_id_ << ": " << ended.message();
}

}  // namespace rlhfd::roles
