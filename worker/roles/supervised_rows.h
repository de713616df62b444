// trainer.mode sft's rows: a conversation's target turns as the tokens a rollout would have
// produced, so that the step's rows take the RL rows' layout (generated_rows.h) and the actor
// learns exactly what a multi-turn rollout would show it: its assistant turns with response mask
// 1 (each ending in the token that stops generation), the tool turns between them with 0, as the
// agent loop inserts them (agent::ToolTurnTokens).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "rlhfd/v1/worker_service.pb.h"
#include "worker/model/tokenizer.h"
#include "worker/rollout/request.h"

namespace rlhfd::roles {

// `row`'s target turns (PromptRow.target) as a completion: the tokens, the response mask and
// zero log-probs. A target longer than data.max_response_length is refused under truncation
// "error" (naming row `index` of the step's batch and its length), else cut to it (finish
// reason length). INVALID_ARGUMENT for a row without target turns, a turn other than assistant
// or tool, or tool turns under a chat template without them.
absl::StatusOr<rollout::Completion> EncodeTarget(const model::Tokenizer& tokenizer,
                                                 const v1::PromptRow& row, const v1::DataSpec& data,
                                                 int64_t index);

// The completions of `prompts`' target turns, in order (the rows of rank's share that starts at
// prompt `first_prompt` of the step).
absl::StatusOr<std::vector<rollout::GenerationResult>> EncodeTargets(
    const model::Tokenizer& tokenizer,
    const google::protobuf::RepeatedPtrField<v1::PromptRow>& prompts, const v1::DataSpec& data,
    int64_t first_prompt);

}  // namespace rlhfd::roles
