#include "controller/driver/job_stages.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/algorithms/supervised.h"
#include "common/logging/logging.h"
#include "common/stages/response_samples.h"
#include "common/status/status_macros.h"
#include "common/util/row_split.h"
#include "common/util/stopwatch.h"
#include "controller/cluster/pool_placement.h"
#include "controller/driver/step_metrics.h"

namespace rlhfd::controller {

using stages::StageService;

JobStages::JobStages(std::string job_id, v1::JobSpec spec, std::vector<StageService*> ranks,
                     JobStagesOptions options)
    : spec_(std::move(spec)),
      calls_(std::move(job_id), std::move(ranks), PlacePools(spec_), options) {}

absl::Status JobStages::Start(int64_t total_steps) {
  const JobStagesOptions& options = calls_.options();
  const int world = WorldSize(calls_.pools());
  if (world != calls_.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("the job's pools span ", world,
                                                   " ranks and it was given ", calls_.world_size(),
                                                   " workers"));
  }
  v1::PrepareJobRequest prepare;
  prepare.set_job_id(calls_.job_id());
  prepare.set_world_size(world);
  prepare.set_nccl(options.nccl);
  prepare.set_attempt(options.attempt);
  ASSIGN_OR_RETURN(const std::vector<v1::PrepareJobReply> prepared,
                   (calls_.FanOut<v1::PrepareJobRequest, v1::PrepareJobReply>(
                       {0}, &StageService::PrepareJob, [&](int, int) { return prepare; })));
  return calls_
      .FanOut<v1::StartJobRequest, v1::StartJobReply>(
          calls_.Everyone(), &StageService::StartJob,
          [&](int rank, int) {
            v1::StartJobRequest start;
            start.set_job_id(calls_.job_id());
            *start.mutable_spec() = spec_;
            start.set_world_size(world);
            start.set_rank(rank);
            for (const v1::PoolAssignment& pool : calls_.pools()) *start.add_pools() = pool;
            *start.mutable_bootstrap() = prepared[0].bootstrap();
            start.set_communicator_timeout_ms(options.communicator_timeout_ms);
            start.set_total_steps(total_steps);
            start.set_attempt(options.attempt);
            return start;
          },
          options.start_deadline)
      .status();
}

absl::StatusOr<Metrics> JobStages::RunStep(const StepPlan& plan, const StepPlan* next) {
  const Stopwatch stopwatch;
  ASSIGN_OR_RETURN(StepResult result, RunStepStages(plan, next));
  RecordStepTime(stopwatch.Seconds(), world_size(), result.metrics);
  return std::move(result.metrics);
}

void JobStages::StartAsyncRollout(std::function<StepPlan(int64_t)> plan_of, int64_t first,
                                  int64_t last) {
  async_.reset();
  async_ = std::make_unique<AsyncRollout>(calls_, spec_, std::move(plan_of), first, last);
}

absl::StatusOr<StepResult> JobStages::RunStepStages(const StepPlan& plan, const StepPlan* next) {
  const bool one_step_off = spec_.trainer().mode() == v1::TRAINER_MODE_ONE_STEP_OFF;
  if (async_) {
    absl::StatusOr<StepRollout> taken = async_->Take(plan.step);
    if (!taken.ok()) {
      async_.reset();  // spent: a run after this failure starts it again
      return taken.status();
    }
    ahead_ = *std::move(taken);
  }
  RolloutSchedule schedule{.ahead = std::exchange(ahead_, std::nullopt),
                           .next = one_step_off ? next : nullptr,
                           // A rollout pool of its own takes no call of the step's training.
                           .overlap = !calls_.RanksOf(v1::ROLE_ROLLOUT).empty()};
  ASSIGN_OR_RETURN(
      StepResult result,
      controller::RunStepStages(calls_, spec_, plan, optimizer_steps_, std::move(schedule)));
  ahead_ = std::move(result.next_rollout);
  result.next_rollout.reset();
  return result;
}

absl::StatusOr<ValidationResult> JobStages::Validate(int64_t step,
                                                     const std::vector<v1::PromptRow>& prompts,
                                                     uint64_t seed) {
  const std::vector<int> actors = calls_.RanksOf(v1::ROLE_ACTOR);
  const int64_t count = static_cast<int64_t>(prompts.size());
  const int64_t dp = static_cast<int64_t>(actors.size());
  ASSIGN_OR_RETURN(const std::vector<v1::ValidateReply> replies,
                   (calls_.FanOut<v1::ValidateRequest, v1::ValidateReply>(
                       actors, &StageService::Validate, [&](int, int position) {
                         const RowRange share = ContiguousPart(count, position, dp);
                         v1::ValidateRequest request;
                         // Validation before step 1 and after step 1 are different calls.
                         *request.mutable_key() = calls_.Key(std::max<int64_t>(step, 1),
                                                             absl::StrCat("validate after ", step));
                         for (int64_t p = share.begin; p < share.end; ++p) {
                           *request.add_prompts() = prompts[p];
                         }
                         request.set_first_prompt(share.begin);
                         request.set_seed(seed);
                         return request;
                       })));
  ValidationResult result;
  if (algorithms::ValidatesByLoss(spec_)) {
    // Token-mean over every validation conversation (verl's SFT trainer averages its batches'
    // token-means, which weighs the tokens of a short batch more).
    double loss = 0, tokens = 0;
    for (const v1::ValidateReply& reply : replies) {
      loss += reply.loss_sum();
      tokens += static_cast<double>(reply.loss_tokens());
    }
    if (tokens > 0) result.metrics["val/loss"] = loss / tokens;
    return result;
  }
  // Scores come n a prompt in prompt order (the driver reads a score's prompt from its index):
  // a rank that answers more than its share has (a worker of another version, or a defect)
  // fails the validation by name rather than make the driver read rows past the data.
  const int64_t n = std::max(1, spec_.roles().actor().rollout().val_kwargs().n());
  for (size_t position = 0; position < replies.size(); ++position) {
    const RowRange share = ContiguousPart(count, static_cast<int64_t>(position), dp);
    if (replies[position].scores_size() > (share.end - share.begin) * n) {
      return absl::InternalError(absl::StrCat("validation: actor rank ", actors[position],
                                              " answered ", replies[position].scores_size(),
                                              " scores for ", share.end - share.begin,
                                              " prompts of n = ", n, " samples each"));
    }
  }
  double tokens = 0;
  std::map<std::string, double> rule_totals;  // roles.reward.val_rules
  for (const v1::ValidateReply& reply : replies) {
    for (const v1::RuleScores& rule : reply.rule_scores()) {
      double& total = rule_totals[rule.rule()];
      for (double score : rule.scores()) total += score;
    }
    result.scores.insert(result.scores.end(), reply.scores().begin(), reply.scores().end());
    result.responses.insert(result.responses.end(), reply.responses().begin(),
                            reply.responses().end());
    for (const v1::RowInfo& row : reply.rows()) tokens += row.response_tokens();
    stages::AppendSamples(reply.samples(), spec_.trainer().log_samples(), result.samples);
  }
  double total = 0;
  for (double score : result.scores) total += score;
  const double responses = std::max<double>(1, static_cast<double>(result.scores.size()));
  result.metrics["val/score/mean"] = total / responses;
  result.metrics["val/response_length/mean"] = tokens / responses;
  std::vector<const google::protobuf::Map<std::string, double>*> turns;
  for (const v1::ValidateReply& reply : replies) turns.push_back(&reply.metrics());
  AddTurnMetrics(turns, responses, "val-aux", result.metrics);
  for (const auto& [rule, total] : rule_totals) {
    result.metrics[absl::StrCat("val/score/", rule, "/mean")] = total / responses;
  }
  return result;
}

v1::CheckpointRequest JobStages::CheckpointCall(int64_t step, const char* stage) {
  v1::CheckpointRequest request;
  *request.mutable_key() = calls_.Key(step, stage);
  request.set_directory(spec_.trainer().checkpoint_dir());
  request.set_step(step);
  request.set_job_submit_time_ms(calls_.options().job_submit_time_ms);
  return request;
}

absl::Status JobStages::SaveOnEveryRank(const v1::CheckpointRequest& request) {
  return calls_
      .FanOut<v1::CheckpointRequest, v1::CheckpointReply>(calls_.AllButRolloutPool(),
                                                          &StageService::SaveCheckpoint,
                                                          [&](int, int) { return request; })
      .status();
}

absl::Status JobStages::Commit(int64_t step) {
  // Only once every rank has saved does `latest` move.
  return calls_
      .FanOut<v1::CheckpointRequest, v1::CheckpointReply>(
          {0}, &StageService::CommitCheckpoint,
          [&](int, int) { return CheckpointCall(step, "commit"); })
      .status();
}

absl::Status JobStages::SaveCheckpoint(int64_t step, bool export_huggingface, double kl_coef) {
  v1::CheckpointRequest save = CheckpointCall(step, "save");
  save.set_export_huggingface(export_huggingface);
  save.set_kl_coef(kl_coef);
  RETURN_IF_ERROR(SaveOnEveryRank(save));
  return Commit(step);
}

absl::Status JobStages::StartBackgroundSave(int64_t step, double kl_coef, int64_t commit_step) {
  v1::CheckpointRequest save = CheckpointCall(step, "save");
  save.set_kl_coef(kl_coef);
  save.set_background(true);
  save.set_commit_step(commit_step);
  // Set first: ranks that made their copy before another failed write it all the same, and the
  // next FinishBackgroundSave (or the run's end) collects them.
  background_save_ = step;
  return SaveOnEveryRank(save);
}

absl::StatusOr<int64_t> JobStages::FinishBackgroundSave() {
  const int64_t step = std::exchange(background_save_, 0);
  if (step == 0) return 0;
  v1::CheckpointRequest finish = CheckpointCall(step, "finish-save");
  finish.set_finish_background(true);
  RETURN_IF_ERROR(SaveOnEveryRank(finish));
  return step;
}

absl::StatusOr<std::vector<v1::CheckpointReply>> JobStages::LoadRound(int64_t want) {
  absl::StatusOr<std::vector<v1::CheckpointReply>> round =
      calls_.FanOut<v1::CheckpointRequest, v1::CheckpointReply>(
          calls_.Everyone(), &StageService::LoadCheckpoint, [&](int, int) {
            v1::CheckpointRequest load;
            *load.mutable_key() = calls_.Key(std::max<int64_t>(want, 1), "load");
            load.set_directory(spec_.trainer().checkpoint_dir());
            load.set_step(want);
            return load;
          });
  if (round.ok()) return round;
  // No step is intact for one rank: the files other ranks found bad in earlier rounds are
  // named too, so the message lists every bad file.
  std::vector<std::string> others;
  for (const std::string& note : passed_over_) {
    if (!absl::StrContains(round.status().message(), note)) others.push_back(note);
  }
  if (!absl::IsDataLoss(round.status()) || others.empty()) return round.status();
  return absl::DataLossError(absl::StrCat(
      round.status().message(), " Other ranks passed over: ", absl::StrJoin(others, "; ")));
}

absl::StatusOr<int64_t> JobStages::LoadCheckpoint(int64_t step) {
  ahead_.reset();        // made with weights the load replaces
  async_.reset();
  background_save_ = 0;  // the ranks drop a save in flight before they load
  const std::string& directory = spec_.trainer().checkpoint_dir();
  passed_over_.clear();
  std::vector<v1::CheckpointReply> loaded;
  // Each rank checks only its own files, so one may find a step intact that another passes
  // over; then every rank loads the older step, until all agree. The step asked for falls each
  // round, so this ends.
  for (int64_t want = step;;) {
    ASSIGN_OR_RETURN(loaded, LoadRound(want));
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
  optimizer_steps_ = {};
  for (const v1::CheckpointReply& reply : loaded) {
    optimizer_steps_.actor = std::max(optimizer_steps_.actor, reply.optimizer_steps());
    optimizer_steps_.critic = std::max(optimizer_steps_.critic, reply.critic_optimizer_steps());
  }
  loaded_kl_coef_ = loaded[0].kl_coef();
  return loaded[0].step();
}

absl::StatusOr<std::vector<std::string>> JobStages::DumpBatch(int64_t step) {
  ASSIGN_OR_RETURN(const std::vector<v1::DumpBatchReply> dumped,
                   (calls_.FanOut<v1::DumpBatchRequest, v1::DumpBatchReply>(
                       calls_.AllButRolloutPool(), &StageService::DumpBatch, [&](int, int) {
                         v1::DumpBatchRequest request;
                         *request.mutable_key() = calls_.Key(step, "dump");
                         request.set_directory(spec_.trainer().rollout_data_dir());
                         return request;
                       })));
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
    *request.mutable_key() = calls_.Key(1, absl::StrCat("measure ", first));
    *request.mutable_spec() = spec_;
    request.set_first_prompt(first);
    int64_t bytes = 0;
    for (end = first; end < total && end - first < kChunkRows; ++end) {
      v1::PromptRow prompt = prompts[end];
      prompt.clear_ground_truth_json();
      prompt.clear_extra_info_json();
      const int64_t size = static_cast<int64_t>(prompt.ByteSizeLong());
      if (end > first && bytes + size > kChunkBytes) break;
      bytes += size;
      *request.add_prompts() = std::move(prompt);
    }
    ASSIGN_OR_RETURN(const std::vector<v1::MeasurePromptsReply> measured,
                     (calls_.FanOut<v1::MeasurePromptsRequest, v1::MeasurePromptsReply>(
                         {0}, &StageService::MeasurePrompts, [&](int, int) { return request; })));
    if (measured[0].tokens_size() != end - first) {
      return absl::InternalError(absl::StrCat("rank 0 measured ", measured[0].tokens_size(), " of ",
                                              end - first, " prompts"));
    }
    tokens.insert(tokens.end(), measured[0].tokens().begin(), measured[0].tokens().end());
  }
  return tokens;
}

void JobStages::End(absl::Duration deadline) {
  async_.reset();  // its calls first
  absl::Status ended = calls_
                           .FanOut<v1::EndJobRequest, v1::EndJobReply>(
                               calls_.Everyone(), &StageService::EndJob,
                               [&](int, int) {
                                 v1::EndJobRequest request;
                                 request.set_job_id(calls_.job_id());
                                 request.set_attempt(calls_.options().attempt);
                                 return request;
                               },
                               deadline, PoolCalls::Reach::kEveryRankDirectly)
                           .status();
  if (!ended.ok()) RLOG(WARNING) << "ending job " << calls_.job_id() << ": " << ended.message();
}

}  // namespace rlhfd::controller
