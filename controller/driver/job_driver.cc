#include "controller/driver/job_driver.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/algorithms/algorithm_traits.h"
#include "common/algorithms/supervised.h"
#include "common/logging/logging.h"
#include "common/stages/stage_service.h"
#include "common/status/status_macros.h"
#include "common/util/clock.h"
#include "common/util/stopwatch.h"
#include "controller/cluster/pool_placement.h"
#include "controller/driver/job_stages.h"
#include "controller/driver/kl_controller.h"
#include "controller/driver/prompt_data.h"
#include "controller/driver/step_metrics.h"

namespace rlhfd::controller {
namespace {

// What a stage call carries besides its rows (key, seeds, framing).
constexpr int64_t kStageCallOverheadBytes = 64 << 10;

// The step's seed: the same for a step whenever it runs (first time or after a resume).
uint64_t StepSeed(const v1::JobSpec& spec, int64_t step) {
  return static_cast<uint64_t>(spec.trainer().seed()) * 1000003ull + static_cast<uint64_t>(step);
}

// The job's checkpoint is now `checkpoint`: what a recovering run loads and goes on from.
void MarkCheckpoint(const CheckpointMark& checkpoint, v1::JobProgress& progress) {
  progress.set_checkpoint_step(checkpoint.step);
  progress.set_checkpoint_epoch(checkpoint.rows.epoch);
  progress.set_checkpoint_batch(checkpoint.rows.batch);
  progress.set_checkpoint_kl_coef(checkpoint.kl_coef);
  progress.set_checkpoint_actor_optimizer_steps(checkpoint.optimizer_steps);
}

bool SavesAt(const v1::TrainerSpec& trainer, int64_t step, int64_t total) {
  if (trainer.checkpoint_dir().empty() || trainer.save_every() < 0) return false;
  if (trainer.save_every() == 0) return step == total;
  return step % trainer.save_every() == 0 || step == total;
}

// A worker names a bad prompt by its index in the step's batch ("prompt 3: ..."): the file and
// line it came from say which to fix.
absl::Status WithOrigin(const absl::Status& status, const PromptData& data,
                        const std::vector<int64_t>& rows) {
  const std::string message(status.message());
  const size_t at = message.find("prompt ");
  if (at == std::string::npos) return status;
  size_t end = at + 7;
  while (end < message.size() && std::isdigit(static_cast<unsigned char>(message[end]))) ++end;
  int64_t index = 0;
  if (end == at + 7 || !absl::SimpleAtoi(message.substr(at + 7, end - at - 7), &index) ||
      index < 0 || index >= static_cast<int64_t>(rows.size())) {
    return status;
  }
  const PromptOrigin& origin = data.origin(rows[index]);
  return absl::Status(status.code(), absl::StrCat(origin.file, ":", origin.line, ": ", message));
}

std::vector<int64_t> Identity(int64_t size) {
  std::vector<int64_t> rows(size);
  for (int64_t i = 0; i < size; ++i) rows[i] = i;
  return rows;
}

}  // namespace

JobDriver::JobDriver(DriverSetup setup, DriverEvents events)
    : setup_(std::move(setup)), events_(std::move(events)), thread_([this] { Run(); }) {}

JobDriver::~JobDriver() {
  Cancel();
  if (thread_.joinable()) thread_.join();
}

void JobDriver::Cancel(absl::Status cause) {
  {
    std::lock_guard<std::mutex> lock(cause_mutex_);
    if (cancelled_.exchange(true)) return;
    cause_ = std::move(cause);
  }
  cancel_wake_.notify_all();
  std::lock_guard<std::mutex> lock(cancel_mutex_);
  if (cancel_calls_) cancel_calls_();
}

bool JobDriver::IsFault(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kAborted:
      return true;
    default:
      return false;
  }
}

void JobDriver::Run() {
  logging::ScopedLogContext context({.job = setup_.job_id});
  absl::Status status;
  try {
    status = Drive();
  } catch (const std::exception& error) {
    status = absl::InternalError(absl::StrCat("the driver failed: ", error.what()));
  }
  if (cancelled_) {
    std::lock_guard<std::mutex> lock(cause_mutex_);
    status = cause_;
  }
  events_.finished(status, IsFault(status),
                   absl::IsDeadlineExceeded(status) ? unanswered_ : std::vector<std::string>());
}

absl::Status JobDriver::SaveWaitingForSpace(JobStages& job, int64_t step, bool export_huggingface,
                                            double kl_coef, int64_t committed) {
  const std::string& directory = setup_.spec.trainer().checkpoint_dir();
  const Stopwatch stopwatch;
  const auto waited = [&] { return stopwatch.Elapsed(); };
  absl::Duration backoff = absl::Seconds(1);
  for (int attempt = 1;; ++attempt) {
    const absl::Status saved = job.SaveCheckpoint(step, export_huggingface, kl_coef);
    if (!absl::IsResourceExhausted(saved)) {
      if (saved.ok() && attempt > 1) {
        events_.notice(absl::StrCat("the checkpoint of step ", step, " is saved: disk space in ",
                                    directory, " returned after ",
                                    absl::FormatDuration(absl::Trunc(waited(), absl::Seconds(1)))));
      }
      return saved;
    }
    // Nothing of this step was committed: the one before stays the job's checkpoint.
    const std::string previous =
        committed > 0 ? absl::StrCat("the checkpoint of step ", committed, " is intact")
                      : std::string("no checkpoint was committed before it");
    if (waited() + backoff > setup_.disk_full_timeout) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the disk holding trainer.checkpoint_dir ", directory,
          " is full: the checkpoint of step ", step, " could not be written (", saved.message(),
          ") for ", absl::FormatDuration(absl::Trunc(waited(), absl::Seconds(1))), "; ", previous,
          ". Free space there (or raise its quota), or set trainer.max_ckpt_to_keep, then resubmit "
          "with trainer.resume: true"));
    }
    events_.notice(absl::StrCat("the disk holding ", directory, " is full (", saved.message(),
                                "): saving the checkpoint of step ", step, " again in ",
                                absl::FormatDuration(backoff),
                                "; the job fails if there is no space within ",
                                absl::FormatDuration(setup_.disk_full_timeout)));
    {
      std::unique_lock<std::mutex> lock(cause_mutex_);
      if (cancel_wake_.wait_for(lock, absl::ToChronoNanoseconds(backoff),
                                [this] { return cancelled_.load(); })) {
        return cause_;
      }
    }
    backoff = std::min(backoff * 2, absl::Seconds(30));
  }
}

absl::StatusOr<bool> JobDriver::SaveAtStep(JobStages& job, int64_t total, int64_t step,
                                           const StepRows& rows, double kl_coef,
                                           v1::JobProgress& progress) {
  const v1::TrainerSpec& trainer = setup_.spec.trainer();
  bool saves = SavesAt(trainer, step, total);
  // The last step's checkpoint (and its export) is whole before the job ends.
  bool background = trainer.async_save() && step < total;
  const bool finishes = background_save_.has_value();
  // A step every rank has written, for this step to commit.
  std::optional<CheckpointMark> written;
  if (finishes) {
    // The save an earlier step started has had this step's stages to write.
    const absl::StatusOr<int64_t> finished = job.FinishBackgroundSave();
    const CheckpointMark save = *std::exchange(background_save_, std::nullopt);
    const std::optional<CheckpointMark> carried = std::exchange(committing_, std::nullopt);
    if (finished.ok()) {
      if (carried) MarkCheckpoint(*carried, progress);
      written = save;
    } else if (absl::IsResourceExhausted(finished.status())) {
      // Made up now, in the foreground, where a full disk is waited out.
      events_.notice(absl::StrCat("the background checkpoint of step ", save.step,
                                  " could not be written (", finished.status().message(),
                                  "); step ", step, " saves in the foreground instead"));
      saves = true;
      background = false;
    } else {
      return finished.status();
    }
  }
  if (saves && background) {
    // Rank 0's thread commits the written step before it writes this one.
    RETURN_IF_ERROR(job.StartBackgroundSave(step, kl_coef, written ? written->step : 0));
    background_save_ = CheckpointMark{.step = step,
                                      .rows = rows,
                                      .kl_coef = kl_coef,
                                      .optimizer_steps = job.actor_optimizer_steps()};
    committing_ = written;
    return true;
  }
  if (written) {
    RETURN_IF_ERROR(job.Commit(written->step));
    MarkCheckpoint(*written, progress);
  }
  if (!saves) return finishes;
  RETURN_IF_ERROR(SaveWaitingForSpace(job, step, /*export_huggingface=*/step == total, kl_coef,
                                      progress.checkpoint_step()));
  MarkCheckpoint({.step = step,
                  .rows = rows,
                  .kl_coef = kl_coef,
                  .optimizer_steps = job.actor_optimizer_steps()},
                 progress);
  return true;
}

absl::Status JobDriver::CheckCancelled() {
  if (!cancelled_) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(cause_mutex_);
  return cause_;
}

// What a run reads: its prompts, and how long it is.
struct JobDriver::RunData {
  PromptData train;
  PromptData validation;
  std::vector<v1::PromptRow> validation_prompts;
  bool validates = false;
  int64_t total = 0;  // the run's last step
};

absl::StatusOr<JobDriver::RunData> JobDriver::LoadData(JobStages& job) {
  const v1::DataSpec& data = setup_.spec.data();
  RunData run;
  const std::vector<std::string> train_files(data.train_files().begin(), data.train_files().end());
  const RowKind training_rows = TrainingRows(setup_.spec);
  ASSIGN_OR_RETURN(run.train, PromptData::Load(train_files, data, training_rows,
                                               ScoringRule(setup_.spec, training_rows)));
  run.validates = data.val_files_size() > 0;
  if (run.validates) {
    const std::vector<std::string> files(data.val_files().begin(), data.val_files().end());
    const RowKind validation_rows = ValidationRows(setup_.spec);
    ASSIGN_OR_RETURN(run.validation, PromptData::Load(files, data, validation_rows,
                                                      ScoringRule(setup_.spec, validation_rows)));
  }
  int64_t train_filtered = 0;
  // Measured by the actor's first worker, which holds the tokenizer.
  const auto measure = [&](const PromptData& prompts) -> absl::StatusOr<std::vector<int64_t>> {
    std::vector<v1::PromptRow> rows;
    for (int64_t i = 0; i < prompts.size(); ++i) rows.push_back(prompts.row(i));
    absl::StatusOr<std::vector<int64_t>> tokens = job.MeasurePrompts(rows);
    if (!tokens.ok()) return WithOrigin(tokens.status(), prompts, Identity(prompts.size()));
    return tokens;
  };
  if (!data.filter_overlong_prompts()) {
    // Measuring encodes each conversation's target as its step (or validation) will: a bad one
    // fails the job now, naming its file and line, not at the step that reaches it.
    if (TrainingRows(setup_.spec) == RowKind::kConversation) {
      RETURN_IF_ERROR(measure(run.train).status());
    }
    if (run.validates && ValidationRows(setup_.spec) == RowKind::kConversation) {
      RETURN_IF_ERROR(measure(run.validation).status());
    }
  }
  if (data.filter_overlong_prompts()) {
    // verl's filter: prompts over max_prompt_length (template applied) are left out.
    for (PromptData* prompts : {&run.train, &run.validation}) {
      ASSIGN_OR_RETURN(const std::vector<int64_t> tokens, measure(*prompts));
      const int64_t dropped = prompts->KeepAtMost(tokens, data.max_prompt_length());
      if (prompts == &run.train) train_filtered = dropped;
      if (dropped > 0) {
        RLOG(INFO) << "data.filter_overlong_prompts left out " << dropped << " of "
                   << dropped + prompts->size() << " prompts over " << data.max_prompt_length()
                   << " tokens";
      }
    }
  }
  if (run.validates && run.validation.size() == 0) {
    // A validation of no rows would report a score of 0 every time.
    return absl::InvalidArgumentError(
        absl::StrCat("data.val_files hold no rows",
                     data.filter_overlong_prompts()
                         ? absl::StrCat(" after data.filter_overlong_prompts left out those over "
                                        "data.max_prompt_length ",
                                        data.max_prompt_length(), " tokens")
                         : "",
                     ": give rows to validate on, or leave val_files out"));
  }
  const int64_t batch_size = data.train_batch_size();
  const int64_t per_epoch = run.train.size() / batch_size;
  if (per_epoch == 0) {
    // Name the filter when it is what emptied the batch: the files themselves may be ample.
    const std::string filtered =
        train_filtered == 0
            ? std::string()
            : absl::StrCat(" after data.filter_overlong_prompts left out ", train_filtered,
                           " over data.max_prompt_length ", data.max_prompt_length(),
                           " tokens (chat template and tools included; raise it, or shorten "
                           "the prompts)");
    return absl::InvalidArgumentError(
        absl::StrCat("data.train_files hold ", run.train.size(), " prompts", filtered,
                     ", fewer than one batch of ", batch_size, " (data.train_batch_size)"));
  }
  // A rank's share of a step, and of a validation, travels in one stage call: rows that could
  // not are refused now, naming the row, rather than by gRPC at some later step.
  const v1::PoolAssignment* actor_pool = FindPool(job.pools(), v1::ROLE_ACTOR);
  const int64_t actor_ranks = actor_pool == nullptr ? 1 : std::max(1, actor_pool->ranks_size());
  const int64_t call_bytes = setup_.rpc.max_request_bytes - kStageCallOverheadBytes;
  RETURN_IF_ERROR(CheckShareFits(run.train, (batch_size + actor_ranks - 1) / actor_ranks,
                                 call_bytes, "data.train_files"));
  RETURN_IF_ERROR(CheckShareFits(run.validation,
                                 (run.validation.size() + actor_ranks - 1) / actor_ranks,
                                 call_bytes, "data.val_files"));
  const v1::TrainerSpec& trainer = setup_.spec.trainer();
  run.total =
      trainer.total_steps() > 0 ? trainer.total_steps() : trainer.total_epochs() * per_epoch;
  for (int64_t i = 0; i < run.validation.size(); ++i) {
    run.validation_prompts.push_back(run.validation.row(i));
  }
  return run;
}

absl::StatusOr<int64_t> JobDriver::Resume(JobStages& job, const RunData& run,
                                          v1::JobProgress& progress, double& kl_coef) {
  const v1::TrainerSpec& trainer = setup_.spec.trainer();
  const v1::DataSpec& data = setup_.spec.data();
  // A run of a job that has committed a checkpoint goes on from it; a new job resumes from the
  // latest in checkpoint_dir when trainer.resume says so (verl's resume_mode auto).
  if (trainer.checkpoint_dir().empty() || !(progress.checkpoint_step() > 0 || trainer.resume())) {
    return 1;
  }
  absl::StatusOr<int64_t> loaded = job.LoadCheckpoint(progress.checkpoint_step());
  for (const std::string& note : job.passed_over()) {
    events_.notice(absl::StrCat("a damaged checkpoint was passed over: ", note));
  }
  if (!loaded.ok()) {
    if (absl::IsNotFound(loaded.status()) && progress.checkpoint_step() == 0) return 1;
    return loaded.status();
  }
  kl_coef = job.loaded_kl_coef();
  const StepRows rows =
      RowsOfStep(run.train, *loaded, data.train_batch_size(), data.shuffle(), data.shuffle_seed());
  MarkCheckpoint({.step = *loaded,
                  .rows = rows,
                  .kl_coef = kl_coef,
                  .optimizer_steps = job.actor_optimizer_steps()},
                 progress);
  RLOG(INFO) << "resumed from the checkpoint of step " << *loaded << " in "
             << trainer.checkpoint_dir();
  return *loaded + 1;
}

absl::Status JobDriver::ValidateInto(JobStages& job, const RunData& run, int64_t step,
                                     Metrics& into, std::vector<v1::ResponseSample>& samples) {
  const v1::JobSpec& spec = setup_.spec;
  // JobStages keys the call by `step` (0: before training), so each validation is its own.
  absl::StatusOr<ValidationResult> validated =
      job.Validate(step, run.validation_prompts, StepSeed(spec, step));
  if (!validated.ok()) {
    return WithOrigin(validated.status(), run.validation, Identity(run.validation.size()));
  }
  const ValidationResult& result = *validated;
  for (const auto& [name, value] : result.metrics) into[name] = value;
  if (algorithms::ValidatesByLoss(spec)) return absl::OkStatus();  // val/loss: no rewards
  samples.insert(samples.end(), result.samples.begin(), result.samples.end());
  // Mean reward per data source (verl's val-core/<source>/reward/mean@<n>).
  const int64_t n = std::max(1, spec.roles().actor().rollout().val_kwargs().n());
  std::map<std::string, std::pair<double, int64_t>> by_source;
  for (size_t i = 0; i < result.scores.size(); ++i) {
    const std::string& source = run.validation.row(static_cast<int64_t>(i) / n).data_source();
    auto& [sum, count] = by_source[source.empty() ? "unknown" : source];
    sum += result.scores[i];
    ++count;
  }
  for (const auto& [source, sum_count] : by_source) {
    into[absl::StrCat("val-core/", source, "/reward/mean@", n)] =
        sum_count.first / static_cast<double>(std::max<int64_t>(1, sum_count.second));
  }
  return absl::OkStatus();
}

StepPlan JobDriver::PlanOf(const RunData& run, int64_t step) const {
  const v1::DataSpec& data = setup_.spec.data();
  StepPlan plan{.step = step, .seed = StepSeed(setup_.spec, step)};
  for (int64_t row :
       RowsOfStep(run.train, step, data.train_batch_size(), data.shuffle(), data.shuffle_seed())
           .rows) {
    plan.prompts.push_back(run.train.row(row));
  }
  return plan;
}

absl::Status JobDriver::RunOneStep(JobStages& job, const RunData& run, int64_t step,
                                   KlController& kl, v1::JobProgress& progress) {
  const v1::JobSpec& spec = setup_.spec;
  const v1::TrainerSpec& trainer = spec.trainer();
  const v1::DataSpec& data = spec.data();
  const bool kl_in_reward = algorithms::KlPenalizesReward(spec.algorithm());
  const Stopwatch stopwatch;
  const StepRows rows =
      RowsOfStep(run.train, step, data.train_batch_size(), data.shuffle(), data.shuffle_seed());
  StepPlan plan = PlanOf(run, step);
  plan.kl_coef = kl_in_reward ? kl.value() : 0.0;
  // one_step_off: the next step's prompts, whose rollout this step generates before it trains.
  std::optional<StepPlan> next;
  if (trainer.mode() == v1::TRAINER_MODE_ONE_STEP_OFF && step < run.total) {
    next = PlanOf(run, step + 1);
  }
  absl::StatusOr<StepResult> stepped = job.RunStepStages(plan, next ? &*next : nullptr);
  if (!stepped.ok()) {
    // A bad prompt of a later step's rollout (one_step_off, async) is named by that step's rows,
    // and this step's batch is not what failed.
    const std::optional<int64_t> rollout_step = FailedRolloutStep(stepped.status());
    const bool in_next = rollout_step.has_value() && *rollout_step != step;
    const absl::Status failed =
        WithOrigin(stepped.status(), run.train,
                   in_next ? RowsOfStep(run.train, *rollout_step, data.train_batch_size(),
                                        data.shuffle(), data.shuffle_seed())
                                 .rows
                           : rows.rows);
    // A step that failed after its batch was complete (a non-finite update, say) leaves the batch
    // where it can be replayed; a stage before that left none, and the dump says so. A lost
    // worker (a fault: the job recovers) or a cancellation has no one to ask.
    if (trainer.rollout_data_dir().empty() || IsFault(failed) || in_next ||
        failed.code() == absl::StatusCode::kCancelled) {
      return failed;
    }
    const absl::StatusOr<std::vector<std::string>> dumped = job.DumpBatch(step);
    if (!dumped.ok()) {
      RLOG(INFO) << "step " << step << " left no batch to dump: " << dumped.status().message();
      return failed;
    }
    return absl::Status(
        failed.code(),
        absl::StrCat(failed.message(), " (the step's batch: ", absl::StrJoin(*dumped, ", "), ")"));
  }
  Metrics* metrics = &stepped->metrics;
  std::vector<v1::ResponseSample>& samples = stepped->samples;
  if (kl_in_reward && metrics->count("actor/reward_kl_penalty")) {
    const int64_t responses =
        static_cast<int64_t>(data.train_batch_size()) * spec.roles().actor().rollout().n();
    kl.Update(metrics->at("actor/reward_kl_penalty"), responses);
  }
  if (!trainer.rollout_data_dir().empty()) {
    RETURN_IF_ERROR(job.DumpBatch(step).status());
  }
  if (run.validates &&
      ((trainer.val_every() > 0 && step % trainer.val_every() == 0) || step == run.total)) {
    const Stopwatch testing;
    RETURN_IF_ERROR(ValidateInto(job, run, step, *metrics, samples));
    (*metrics)["timing_s/testing"] = testing.Seconds();
  }
  const Stopwatch saving;
  ASSIGN_OR_RETURN(const bool saved, SaveAtStep(job, run.total, step, rows, kl.value(), progress));
  if (saved) (*metrics)["timing_s/save_checkpoint"] = saving.Seconds();
  if (algorithms::KlInLoss(spec.algorithm())) {
    (*metrics)["actor/kl_coef"] = spec.algorithm().kl().coef();  // verl logs the loss's coef
  }
  // verl's step time covers the whole step, validation and the checkpoint included.
  const double seconds = stopwatch.Seconds();
  RecordStepTime(seconds, job.world_size(), *metrics);
  (*metrics)["training/epoch"] = static_cast<double>(rows.epoch);
  (*metrics)["training/global_step"] = static_cast<double>(step);
  progress.set_current_step(step);
  progress.set_step_time_s(seconds);
  progress.clear_last_metrics();
  v1::StepMetrics record;
  record.set_step(step);
  record.set_time_ms(NowUnixMillis());
  for (const auto& [name, value] : *metrics) {
    (*record.mutable_metrics())[name] = value;
    (*progress.mutable_last_metrics())[name] = value;
  }
  for (v1::ResponseSample& sample : samples) *record.add_samples() = std::move(sample);
  events_.step(record, progress);
  return absl::OkStatus();
}

absl::Status JobDriver::Drive() {
  const v1::JobSpec& spec = setup_.spec;
  const v1::TrainerSpec& trainer = spec.trainer();
  std::vector<std::unique_ptr<stages::StageService>> services;
  for (const std::string& address : setup_.addresses) {
    ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, MakeChannel(address, setup_.rpc));
    services.push_back(stages::MakeGrpcStageService(std::move(channel), setup_.token));
  }
  {
    std::lock_guard<std::mutex> lock(cancel_mutex_);
    cancel_calls_ = [&services] {
      for (auto& service : services) service->CancelCalls();
    };
  }
  const absl::Cleanup forget_calls = [this] {
    std::lock_guard<std::mutex> lock(cancel_mutex_);
    cancel_calls_ = nullptr;
  };
  std::vector<stages::StageService*> ranks;
  for (auto& service : services) ranks.push_back(service.get());
  std::vector<std::string> rank_names;
  for (size_t rank = 0; rank < setup_.worker_ids.size() && rank < setup_.addresses.size(); ++rank) {
    rank_names.push_back(
        absl::StrCat("worker ", setup_.worker_ids[rank], " at ", setup_.addresses[rank]));
  }
  JobStages job(setup_.job_id, spec, ranks,
                {.stage_deadline = setup_.stage_deadline,
                 .communicator_timeout_ms = setup_.communicator_timeout_ms,
                 .nccl = setup_.nccl,
                 .attempt = setup_.progress.attempt(),
                 .job_submit_time_ms = setup_.job_submit_time_ms,
                 .rank_names = std::move(rank_names),
                 .relay_above = setup_.stage_relay_above,
                 .rank_addresses = setup_.addresses});
  const absl::Cleanup note_unanswered = [this, &job] {
    for (int rank : job.unanswered_ranks()) {
      if (rank < static_cast<int>(setup_.worker_ids.size())) {
        unanswered_.push_back(setup_.worker_ids[rank]);
      }
    }
  };
  // However the run ends, the workers' roles end with it (their communicators aborted). A
  // cancelled run (a lost or hung worker among them) waits less for its workers' answers.
  const absl::Cleanup end_roles = [this, &job] {
    job.End(cancelled_ ? absl::Seconds(3) : absl::Seconds(20));
  };

  ASSIGN_OR_RETURN(const RunData run, LoadData(job));
  RETURN_IF_ERROR(job.Start(run.total));
  RETURN_IF_ERROR(CheckCancelled());
  v1::JobProgress progress = setup_.progress;
  progress.set_total_steps(run.total);
  double kl_coef = spec.algorithm().kl().coef();
  ASSIGN_OR_RETURN(const int64_t first, Resume(job, run, progress, kl_coef));
  if (first > run.total && !trainer.val_only()) {
    // This job's own last step was saved before its end was recorded: nothing is left to do.
    if (setup_.progress.checkpoint_step() > 0) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint in ", trainer.checkpoint_dir(), " is of step ", first - 1,
        ", at or past the run's last step ", run.total,
        " (trainer.total_steps): raise it, or point trainer.checkpoint_dir elsewhere"));
  }
  progress.set_current_step(first - 1);
  KlController kl(spec.algorithm().kl(), kl_coef);
  if (trainer.mode() == v1::TRAINER_MODE_ASYNC && !trainer.val_only()) {
    job.StartAsyncRollout([this, &run](int64_t step) { return PlanOf(run, step); }, first,
                          run.total);
  }
  events_.running(progress);

  // Before the first step (or, with val_only, of the actor as loaded, at its step), unless
  // resumed past it.
  if (run.validates && ((first == 1 && trainer.val_before_train()) || trainer.val_only())) {
    Metrics metrics;
    std::vector<v1::ResponseSample> samples;
    RETURN_IF_ERROR(ValidateInto(job, run, first - 1, metrics, samples));
    v1::StepMetrics step;
    step.set_step(first - 1);
    step.set_time_ms(NowUnixMillis());
    for (const auto& [name, value] : metrics) (*step.mutable_metrics())[name] = value;
    for (v1::ResponseSample& sample : samples) *step.add_samples() = std::move(sample);
    events_.step(step, progress);
  }
  if (trainer.val_only()) return absl::OkStatus();
  for (int64_t step = first; step <= run.total; ++step) {
    RETURN_IF_ERROR(CheckCancelled());
    RETURN_IF_ERROR(RunOneStep(job, run, step, kl, progress));
  }
  return absl::OkStatus();
}

}  // namespace rlhfd::controller
