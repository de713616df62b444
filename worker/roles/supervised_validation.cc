#include "worker/roles/supervised_validation.h"

#include <ATen/ATen.h>

#include "common/status/status_macros.h"
#include "common/util/row_split.h"
#include "worker/roles/step_batch.h"

namespace rlhfd::roles {

absl::StatusOr<v1::ValidateReply> SupervisedValidation(ActorRole& actor,
                                                       const v1::ValidateRequest& request) {
  v1::GenerateRequest rows_request;
  *rows_request.mutable_key() = request.key();
  *rows_request.mutable_prompts() = request.prompts();
  rows_request.set_first_prompt(request.first_prompt());
  rows_request.set_seed(request.seed());
  // Its own batch: the step's rows stay as they are. One row per conversation (rollout.n is 1
  // in trainer.mode sft).
  const RowRange rows{request.first_prompt(), request.first_prompt() + request.prompts_size()};
  StepBatch batch;
  RETURN_IF_ERROR(actor.Generate(rows_request, rows.end, rows, batch).status());
  ASSIGN_OR_RETURN(const at::Tensor log_probs, actor.ResponseLogProbsOf(batch));
  ASSIGN_OR_RETURN(const at::Tensor mask, batch.Get("response_mask", "the validation loss"));
  const at::Tensor scored = mask.to(at::kDouble);
  v1::ValidateReply reply;
  reply.set_loss_sum(-(log_probs.to(at::kDouble) * scored).sum().item<double>());
  reply.set_loss_tokens(static_cast<int64_t>(scored.sum().item<double>()));
  return reply;
}

}  // namespace rlhfd::roles
