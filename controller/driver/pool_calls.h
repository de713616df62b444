// A job's ranks as its pools, for the driver: one stage call to every rank of a pool at once
// (FanOut, which waits for all of them), the calls' keys, and moves of a step's tensors from
// one pool to another. No LibTorch; blocking: call it from the driver's threads (fan-outs to
// different pools may run at once).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/stages/stage_service.h"
#include "rlhfd/v1/worker_service.pb.h"

namespace rlhfd::controller {

// A step's metrics in verl's names (actor/pg_loss, critic/score/mean, timing_s/gen, ...).
using Metrics = std::map<std::string, double>;

struct JobStagesOptions {
  absl::Duration stage_deadline = absl::Minutes(30);  // each stage call
  absl::Duration start_deadline = absl::Minutes(10);  // StartJob: loading models, rendezvous
  int64_t communicator_timeout_ms = 300000;
  bool nccl = false;  // GPU workers: NCCL; else sockets
  // The job's attempt (StageKey.attempt); a driver that recovers a job uses a new one.
  int64_t attempt = 1;
  // When the job was submitted: checkpoint calls name their writer with it (CheckpointRequest).
  int64_t job_submit_time_ms = 0;
  // How errors name each world rank's worker ("worker W at HOST:PORT"); empty: by rank alone.
  std::vector<std::string> rank_names;
  // Fan-out through the workers: a fan-out to more than `relay_above` ranks (0: never) hands
  // groups of about √n of them to one worker each (its own rank's, the group's first), which
  // makes the group's calls (WorkerService.Relay): the controller makes about √n calls instead
  // of n. Past the stage deadline, a relaying worker that is itself hung makes its whole group
  // count as not answering. Needs `rank_addresses`.
  int relay_above = 0;
  int relay_group = 0;  // ranks a relay calls at most (0: ⌈√n⌉ of a fan-out to n)
  std::vector<std::string> rank_addresses;  // each world rank's WorkerService, host:port
};

// The rows of a step's batch and their widths, which a move names to the ranks it involves.
struct StepShape {
  int64_t rows = 0;
  int32_t prompt_length = 0;
  int32_t response_length = 0;
};

template <typename Request, typename Reply>
using StageMethod = void (stages::StageService::*)(const Request&, absl::Duration,
                                                   stages::StageDone<Reply>);

class PoolCalls {
 public:
  // `ranks[r]` serves world rank r and outlives this object.
  PoolCalls(std::string job_id, std::vector<stages::StageService*> ranks,
            std::vector<v1::PoolAssignment> pools, JobStagesOptions options);

  // Calls `method` on each rank of `ranks` at once with `make(rank, position)`; the replies in
  // the same order, or the first failure, naming its rank. `deadline`: the stage deadline when
  // not given. A call past that deadline fails the fan-out naming every rank that had not
  // answered by then (a hung or slow worker, and those waiting for it in a collective), which
  // unanswered() keeps. Past JobStagesOptions::relay_above the calls go through relaying
  // workers, unless `reach` is kEveryRankDirectly (EndJob: each rank must get it, whatever the
  // worker that would relay it does).
  enum class Reach { kRelaysPastThreshold, kEveryRankDirectly };
  template <typename Request, typename Reply>
  absl::StatusOr<std::vector<Reply>> FanOut(
      const std::vector<int>& ranks, StageMethod<Request, Reply> method,
      const std::function<Request(int rank, int position)>& make,
      std::optional<absl::Duration> deadline = std::nullopt,
      Reach reach = Reach::kRelaysPastThreshold) const;

  // Moves `tensors` of the step from one pool to another (nothing when they share their ranks);
  // the bytes sent add to metrics["perf/moved_bytes"].
  // `tensors` are names of the step-tensor table (common/stages/step_tensors.h).
  absl::Status Move(int64_t step, const StepShape& shape,
                    const std::vector<std::string_view>& tensors, v1::Role from, v1::Role to,
                    Metrics& metrics) const;

  // Cancels the stage calls in flight to `ranks` (they fail CANCELLED).
  void CancelCalls(const std::vector<int>& ranks) const;

  // The world ranks of `role`'s pool (none when the job has no such pool).
  std::vector<int> RanksOf(v1::Role role) const;
  // Every world rank.
  std::vector<int> Everyone() const;
  // Every world rank but the rollout pool's (roles.rollout), which keeps no state to save and no
  // rows but those it generates, and may be generating ahead (trainer.mode async).
  std::vector<int> AllButRolloutPool() const;
  // The world ranks that had not answered when a fan-out ran past its deadline, of every
  // fan-out that did (none otherwise).
  std::vector<int> unanswered() const;
  v1::StageKey Key(int64_t step, const std::string& stage) const;

  const std::string& job_id() const { return job_id_; }
  const std::vector<v1::PoolAssignment>& pools() const { return pools_; }
  const JobStagesOptions& options() const { return options_; }
  int world_size() const { return static_cast<int>(ranks_.size()); }

 private:
  // "rank R (worker W at HOST:PORT)".
  std::string RankName(int rank) const;
  // Whether a fan-out to `count` ranks goes through relays (JobStagesOptions::relay_above).
  bool Relays(size_t count) const;
  // A fan-out's relay groups, [first, end) positions: consecutive, about √n ranks each, each
  // group's requests (serialized) within what one relay call may carry.
  std::vector<std::pair<size_t, size_t>> RelayGroups(
      const std::vector<std::string>& serialized) const;
  // "ranks A–B" of positions [first, end) of `ranks`, for errors.
  static std::string RelayGroupName(const std::vector<int>& ranks, size_t first, size_t end);

  std::string job_id_;
  std::vector<stages::StageService*> ranks_;

  std::vector<v1::PoolAssignment> pools_;
  JobStagesOptions options_;
  mutable std::mutex unanswered_mutex_;
  mutable std::set<int> unanswered_;
};

template <typename Request, typename Reply>
absl::StatusOr<std::vector<Reply>> PoolCalls::FanOut(
    const std::vector<int>& ranks, StageMethod<Request, Reply> method,
    const std::function<Request(int rank, int position)>& make,
    std::optional<absl::Duration> deadline, Reach reach) const {
  // Outlives this call: replies that come after a failure land here and are dropped.
  struct Gather {
    std::mutex mutex;
    std::condition_variable done;
    size_t left = 0;
    std::optional<size_t> failed;  // the first rank (position) whose call failed
    std::vector<absl::StatusOr<Reply>> replies;
    std::vector<bool> answered;

    // With `mutex` held: position i's answer.
    void Answer(size_t i, absl::StatusOr<Reply> reply) {
      if (!reply.ok() && !failed) failed = i;
      replies[i] = std::move(reply);
      answered[i] = true;
      --left;
    }
    void NotifyIfDone() {
      if (left == 0 || failed) done.notify_all();
    }
  };
  const absl::Duration allowed = deadline.value_or(options_.stage_deadline);
  const absl::Time started = absl::Now();
  auto gather = std::make_shared<Gather>();
  gather->left = ranks.size();
  gather->replies.resize(ranks.size(), absl::UnknownError("no reply"));
  gather->answered.resize(ranks.size(), false);
  for (const int rank : ranks) {
    if (rank < 0 || rank >= static_cast<int>(ranks_.size())) {
      return absl::InternalError(absl::StrCat("rank ", rank, " is outside the job's world"));
    }
  }
  const auto call_directly = [&](size_t i, const Request& request) {
    (ranks_[ranks[i]]->*method)(request, allowed, [gather, i](absl::StatusOr<Reply> reply) {
      std::lock_guard<std::mutex> lock(gather->mutex);
      gather->Answer(i, std::move(reply));
      gather->NotifyIfDone();
    });
  };
  if (reach == Reach::kEveryRankDirectly || !Relays(ranks.size())) {
    for (size_t i = 0; i < ranks.size(); ++i) call_directly(i, make(ranks[i], static_cast<int>(i)));
  } else {
    // Fan-out through the workers: each group's first rank makes the group's calls (Relay).
    std::vector<std::string> serialized(ranks.size());
    for (size_t i = 0; i < ranks.size(); ++i) {
      serialized[i] = make(ranks[i], static_cast<int>(i)).SerializeAsString();
    }
    const std::string_view stage = stages::StageMethodName(method);
    for (const auto& [first, end] : RelayGroups(serialized)) {
      if (end - first == 1) {
        Request request;
        request.ParseFromString(serialized[first]);
        call_directly(first, request);
        continue;
      }
      v1::RelayRequest relay;
      relay.set_stage(std::string(stage));
      for (size_t i = first; i < end; ++i) {
        v1::RelayedCall& call = *relay.add_calls();
        call.set_address(options_.rank_addresses[ranks[i]]);
        call.set_request(std::move(serialized[i]));
      }
      ranks_[ranks[first]]->Relay(
          relay, allowed,
          [gather, first, end,
           group = RelayGroupName(ranks, first, end)](absl::StatusOr<v1::RelayReply> relayed) {
            std::lock_guard<std::mutex> lock(gather->mutex);
            if (relayed.ok() && relayed->replies_size() != static_cast<int>(end - first)) {
              relayed = absl::InternalError(absl::StrCat(relayed->replies_size(), " replies to ",
                                                         end - first, " relayed calls"));
            }
            if (!relayed.ok()) {
              // The relay itself failed: its worker answers for the group, and no answer comes
              // for the others (past the deadline, every rank of the group is named as not
              // answering).
              gather->Answer(first, absl::Status(relayed.status().code(),
                                                 absl::StrCat("relaying the calls of ", group, ": ",
                                                              relayed.status().message())));
              gather->left -= end - first - 1;
              gather->NotifyIfDone();
              return;
            }
            // A call the relay did not wait for is one another call's failure left behind.
            bool group_failed = false;
            for (const v1::RelayedReply& reply : relayed->replies()) {
              group_failed |= reply.answered() && reply.code() != 0;
            }
            for (size_t i = first; i < end; ++i) {
              const v1::RelayedReply& reply = relayed->replies(static_cast<int>(i - first));
              if (!reply.answered()) {
                if (group_failed) {
                  --gather->left;
                } else {
                  gather->Answer(i, absl::InternalError("its relaying worker left it unanswered"));
                }
              } else if (reply.code() != 0) {
                gather->Answer(
                    i, absl::Status(static_cast<absl::StatusCode>(reply.code()), reply.message()));
              } else if (Reply parsed; parsed.ParseFromString(reply.reply())) {
                gather->Answer(i, std::move(parsed));
              } else {
                gather->Answer(i, absl::InternalError("a relayed reply does not parse"));
              }
            }
            gather->NotifyIfDone();
          });
    }
  }
  // The first failure ends the fan-out: the other ranks may be waiting in a collective for the
  // failed one, and would hold the step until the collective timeout. Ending the attempt
  // (EndJob, which the driver sends next) interrupts them.
  std::unique_lock<std::mutex> lock(gather->mutex);
  gather->done.wait(lock, [&] { return gather->left == 0 || gather->failed.has_value(); });
  if (gather->failed) {
    const size_t i = *gather->failed;
    const absl::Status& status = gather->replies[i].status();
    // Relayed calls end a margin before the stage deadline (so the relay can still answer);
    // twice that leaves room for the relay's own start.
    if (!absl::IsDeadlineExceeded(status) ||
        absl::Now() - started < allowed - 2 * stages::RelayCallMargin(allowed)) {
      return absl::Status(status.code(), absl::StrCat(RankName(ranks[i]), ": ", status.message()));
    }
    // Past the stage deadline: every call shares it, so the others end within moments; each
    // rank without an answer by then is named.
    gather->done.wait_for(lock, std::chrono::seconds(2), [&] { return gather->left == 0; });
    std::vector<int> silent;
    std::vector<std::string> names;
    for (size_t j = 0; j < ranks.size(); ++j) {
      if (!gather->answered[j] || absl::IsDeadlineExceeded(gather->replies[j].status())) {
        silent.push_back(ranks[j]);
        names.push_back(RankName(ranks[j]));
      }
    }
    {
      // Fan-outs to disjoint pools run at once (the step's forwards): each adds its silent ranks.
      std::lock_guard<std::mutex> unanswered_lock(unanswered_mutex_);
      unanswered_.insert(silent.begin(), silent.end());
    }
    std::string stage = Request::descriptor()->name();
    if (stage.size() > 7 && stage.ends_with("Request")) stage.resize(stage.size() - 7);
    return absl::DeadlineExceededError(absl::StrCat(
        "no answer to ", stage, " within the stage deadline of ", absl::FormatDuration(allowed),
        " (the controller's --stage_timeout) from ", absl::StrJoin(names, ", "),
        ": a worker there is hung or too slow (ranks waiting for it in a collective stop "
        "answering too)"));
  }
  std::vector<Reply> replies;
  for (size_t i = 0; i < ranks.size(); ++i) replies.push_back(*std::move(gather->replies[i]));
  return replies;
}

}  // namespace rlhfd::controller
