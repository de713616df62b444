// trainer.mode sft's validation by the loss (algorithms::ValidatesByLoss), verl's SFT trainer's:
// the actor's negative log-likelihood of the validation conversations' assistant tokens under its
// current weights, computed as a step's rows are (their target turns laid out as a rollout's,
// generated_rows.h) by the old-log-prob forward, at temperature 1.
#pragma once

#include "absl/status/statusor.h"
#include "rlhfd/v1/worker_service.pb.h"
#include "worker/roles/actor_role.h"

namespace rlhfd::roles {

// This rank's share of the validation conversations: their summed negative log-likelihood and
// token count (ValidateReply.loss_sum, loss_tokens). Every actor rank calls it at once, as the
// forwards are collective under ZeRO-3 (a rank with no conversations takes part too).
absl::StatusOr<v1::ValidateReply> SupervisedValidation(ActorRole& actor,
                                                       const v1::ValidateRequest& request);

}  // namespace rlhfd::roles
