#include "worker/roles/hosted_job.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/stages/role_names.h"
#include "common/util/files.h"
#include "common/util/text.h"

namespace rlhfd::roles {

StepBatch& HostedJob::BatchOf(int64_t step) {
  // one_step_off: step s's stages follow step s + 1's rollout; async: a rollout rank generates up
  // to max_staleness batches ahead of the one the actor takes next. Otherwise a step's memory
  // goes as soon as the next one begins.
  int64_t kept = 0;
  if (spec.trainer().mode() == v1::TRAINER_MODE_ONE_STEP_OFF) kept = 1;
  if (spec.trainer().mode() == v1::TRAINER_MODE_ASYNC) {
    kept = std::max(1, spec.trainer().max_staleness());
  }
  batches.erase(batches.begin(), batches.lower_bound(step - kept));
  return batches[step];
}

HostedRole* HostedJob::Role(v1::Role role) {
  switch (role) {
    case v1::ROLE_ACTOR:
      return actor.get();
    case v1::ROLE_CRITIC:
      return critic.get();
    case v1::ROLE_REFERENCE:
      return reference.get();
    case v1::ROLE_REWARD:
      return reward_model.get();
    default:
      return nullptr;
  }
}

std::vector<std::pair<v1::Role, TrainedRole*>> HostedJob::TrainedRoles() {
  std::vector<std::pair<v1::Role, TrainedRole*>> trained;
  if (actor) trained.emplace_back(v1::ROLE_ACTOR, actor.get());
  if (critic) trained.emplace_back(v1::ROLE_CRITIC, critic.get());
  return trained;
}

absl::Status CheckAttempt(int64_t attempt) {
  if (attempt < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("attempt ", attempt, ": a call must name its job's attempt (from 1)"));
  }
  return absl::OkStatus();
}

absl::Status NeedRole(const HostedJob& job, v1::Role role, bool hosted) {
  if (hosted) return absl::OkStatus();
  // The reward pool hosts a reward model (rule and remote rewards need no pool).
  const char* name = role == v1::ROLE_REWARD ? "reward model" : stages::RoleName(role);
  return absl::FailedPreconditionError(
      absl::StrCat("this worker (rank ", job.layout->rank(), ") does not host the job's ", name));
}

absl::Status NeedStepRows(const StepBatch& batch, int64_t step, absl::string_view stage) {
  if (batch.begun() && batch.step() == step) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(stage, ": step ", step,
                   " has not generated here (this rank holds none of its rows; generate, or "
                   "move them here, first)"));
}

absl::Status CheckConfiguredDirectory(const std::string& requested, const std::string& configured,
                                      absl::string_view key) {
  if (configured.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("this job sets no ", key, "; a stage request cannot name a directory"));
  }
  const std::string clean = CleanAbsolutePath(requested);
  if (clean.empty() || clean != CleanAbsolutePath(configured)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "directory '", SanitizeForDisplay(requested, 200), "' is not this job's ", key, " (",
        SanitizeForDisplay(configured, 200), "): a stage request may name only that one"));
  }
  return absl::OkStatus();
}

}  // namespace rlhfd::roles
