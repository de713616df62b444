// Generations the actor scores itself, outside the step's batch: validation (rollout.val_kwargs
// over the validation prompts) and ReMax's baseline (verl's gen_max: one greedy response per
// prompt). Both run through the actor's hybrid engine and score with the rule or remote scorer.
#pragma once

#include <atomic>
#include <vector>

#include "absl/status/statusor.h"
#include "rlhfd/v1/worker_service.pb.h"
#include "worker/roles/actor_role.h"
#include "worker/roles/response_scorer.h"

namespace rlhfd::roles {

// Generates for the validation prompts with rollout.val_kwargs and scores them with `scorer`.
absl::StatusOr<v1::ValidateReply> ValidateActor(ActorRole& actor,
                                                const v1::ValidateRequest& request,
                                                const ResponseScorer& scorer,
                                                const std::atomic<bool>* cancelled);
// ReMax's baseline: one greedy response to each of the step's prompts, scored with `scorer`;
// a score per prompt.
absl::StatusOr<std::vector<double>> GreedyBaseline(ActorRole& actor,
                                                   const v1::GenerateRequest& request,
                                                   const ResponseScorer& scorer,
                                                   const std::atomic<bool>* cancelled);

}  // namespace rlhfd::roles
