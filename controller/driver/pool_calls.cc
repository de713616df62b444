#include "controller/driver/pool_calls.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_join.h"
#include "common/stages/role_names.h"
#include "common/status/status_macros.h"
#include "controller/cluster/pool_placement.h"

namespace rlhfd::controller {

PoolCalls::PoolCalls(std::string job_id, std::vector<stages::StageService*> ranks,
                     std::vector<v1::PoolAssignment> pools, JobStagesOptions options)
    : job_id_(std::move(job_id)),
      ranks_(std::move(ranks)),
      pools_(std::move(pools)),
      options_(options) {}

std::string PoolCalls::RankName(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(options_.rank_names.size())) {
    return absl::StrCat("rank ", rank);
  }
  return absl::StrCat("rank ", rank, " (", options_.rank_names[rank], ")");
}

bool PoolCalls::Relays(size_t count) const {
  return options_.relay_above > 0 && count > static_cast<size_t>(options_.relay_above) &&
         options_.rank_addresses.size() == ranks_.size();
}

std::vector<std::pair<size_t, size_t>> PoolCalls::RelayGroups(
    const std::vector<std::string>& serialized) const {
  // Well within the 4 MiB a worker reads by default (RpcOptions::max_request_bytes).
  constexpr size_t kRelayBytes = size_t{2} << 20;
  const size_t count = serialized.size();
  const auto size =
      options_.relay_group > 0
          ? static_cast<size_t>(options_.relay_group)
          : static_cast<size_t>(std::ceil(std::sqrt(static_cast<double>(count))));
  std::vector<std::pair<size_t, size_t>> groups;
  size_t first = 0, bytes = 0;
  for (size_t i = 0; i < count; ++i) {
    const size_t request = serialized[i].size() + 64;  // the address and framing
    if (i > first && (i - first == size || bytes + request > kRelayBytes)) {
      groups.emplace_back(first, i);
      first = i;
      bytes = 0;
    }
    bytes += request;
  }
  if (first < count) groups.emplace_back(first, count);
  return groups;
}

std::string PoolCalls::RelayGroupName(const std::vector<int>& ranks, size_t first, size_t end) {
  std::vector<int> group(ranks.begin() + static_cast<std::ptrdiff_t>(first),
                         ranks.begin() + static_cast<std::ptrdiff_t>(end));
  return absl::StrCat("ranks ", absl::StrJoin(group, ","));
}

void PoolCalls::CancelCalls(const std::vector<int>& ranks) const {
  for (int rank : ranks) {
    if (rank >= 0 && rank < static_cast<int>(ranks_.size())) ranks_[rank]->CancelCalls();
  }
}

std::vector<int> PoolCalls::unanswered() const {
  std::lock_guard<std::mutex> lock(unanswered_mutex_);
  return {unanswered_.begin(), unanswered_.end()};
}

std::vector<int> PoolCalls::RanksOf(v1::Role role) const {
  const v1::PoolAssignment* pool = FindPool(pools_, role);
  if (pool == nullptr) return {};
  return std::vector<int>(pool->ranks().begin(), pool->ranks().end());
}

std::vector<int> PoolCalls::Everyone() const {
  std::vector<int> everyone(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) everyone[r] = static_cast<int>(r);
  return everyone;
}

std::vector<int> PoolCalls::AllButRolloutPool() const {
  const std::vector<int> pool = RanksOf(v1::ROLE_ROLLOUT);
  std::vector<int> ranks;
  for (int rank : Everyone()) {
    if (std::find(pool.begin(), pool.end(), rank) == pool.end()) ranks.push_back(rank);
  }
  return ranks;
}

v1::StageKey PoolCalls::Key(int64_t step, const std::string& stage) const {
  v1::StageKey key;
  key.set_job_id(job_id_);
  key.set_step(step);
  key.set_stage(stage);
  key.set_attempt(options_.attempt);
  return key;
}

absl::Status PoolCalls::Move(int64_t step, const StepShape& shape,
                             const std::vector<std::string_view>& tensors, v1::Role from,
                             v1::Role to, Metrics& metrics) const {
  const std::vector<int> sources = RanksOf(from), destinations = RanksOf(to);
  if (sources.empty() || destinations.empty() || sources == destinations) return absl::OkStatus();
  std::vector<int> involved = sources;
  for (int rank : destinations) {
    if (std::find(involved.begin(), involved.end(), rank) == involved.end())
      involved.push_back(rank);
  }
  std::string names;  // absl::StrJoin here takes no std::string_view (Debian's Abseil)
  for (std::string_view name : tensors) names.append(names.empty() ? "" : ",").append(name);
  const std::string stage =
      absl::StrCat("move ", names, " ", stages::RoleName(from), ">", stages::RoleName(to));
  ASSIGN_OR_RETURN(const std::vector<v1::MoveTensorsReply> replies,
                   (FanOut<v1::MoveTensorsRequest, v1::MoveTensorsReply>(
                       involved, &stages::StageService::MoveTensors, [&](int, int) {
                         v1::MoveTensorsRequest move;
                         *move.mutable_key() = Key(step, stage);
                         for (std::string_view name : tensors) move.add_tensors(std::string(name));
                         move.set_from_role(from);
                         move.set_to_role(to);
                         move.set_rows(shape.rows);
                         move.set_prompt_length(shape.prompt_length);
                         move.set_response_length(shape.response_length);
                         return move;
                       })));
  for (const v1::MoveTensorsReply& reply : replies) {
    metrics["perf/moved_bytes"] += static_cast<double>(reply.bytes_sent());
  }
  return absl::OkStatus();
}

}  // namespace rlhfd::controller
