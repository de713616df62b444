// trainer.mode sft's rows: a conversation's target turns as the tokens a multi-turn rollout would
// have produced, so that the step's rows take the RL rows' layout (generated_rows.h) and the actor
// learns exactly what such a rollout shows it: its assistant turns with response mask 1 (each
// ending in the token that stops generation), the tool turns between them with 0, cut and
// inserted as the agent loop inserts them (agent::ToolTurnTokens).
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
// zero log-probs. Tool responses are cut to multi_turn.max_tool_response_length at its
// tool_response_truncate_side, as a rollout's are. A target longer than the rollout's budget
// (rollout.max_new_tokens, else data.max_response_length) is refused under data.truncation
// "error" (naming row `index` and its length), else cut to it (finish reason
// length). INVALID_ARGUMENT, naming the row, for a row without target turns, a turn other than
// assistant or tool, tool turns without multi_turn (whose tool config lists the tools in the
// prompt), tool turns after an assistant turn without a <tool_call> block (a rollout would end
// there), or more turns than multi_turn.max_assistant_turns / max_user_turns allow.
absl::StatusOr<rollout::Completion> EncodeTarget(const model::Tokenizer& tokenizer,
                                                 const v1::PromptRow& row, const v1::JobSpec& spec,
                                                 int64_t index);

// The completions of `prompts`' target turns, in order (the rows of a rank's share that starts
// at prompt `first_prompt` of the step).
absl::StatusOr<std::vector<rollout::GenerationResult>> EncodeTargets(
    const model::Tokenizer& tokenizer,
    const google::protobuf::RepeatedPtrField<v1::PromptRow>& prompts, const v1::JobSpec& spec,
    int64_t first_prompt);

}  // namespace rlhfd::roles
