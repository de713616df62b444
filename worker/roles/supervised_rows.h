// trainer.mode sft's rows: a conversation's target turns as the tokens the chat template renders
// after the prompt, laid out as a rollout's rows (generated_rows.h): the assistant turns with
// response mask 1 (each ending in the token that stops generation), the user and tool turns
// between them with 0. Tool turns are inserted as the agent loop inserts them (one user turn of
// <tool_response> blocks, cut as multi_turn cuts them), so that a conversation a multi-turn
// rollout could make is trained on exactly the tokens such a rollout shows the actor.
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
// zero log-probs. An assistant turn's structured tool calls are rendered as the template renders
// them. Under multi_turn, tool responses are cut to max_tool_response_length at its
// tool_response_truncate_side, as a rollout's are, and the turns are held to its
// max_assistant_turns / max_user_turns (groups of user and tool turns). A target longer than the
// rollout's budget (rollout.max_new_tokens, else data.max_response_length) is refused under
// data.truncation "error" (naming row `index` and its length), else cut to it (finish reason
// length). INVALID_ARGUMENT, naming the row, for a row without target turns, a turn other than
// assistant, user or tool, a tool turn when the prompt lists no tools (neither the row's,
// data.tools_key, nor multi_turn's), a tool turn not right after an assistant turn that calls
// tools (or after other tool turns), a target that ends in another turn than an assistant's, or a
// template that cannot render the turns (Llama 3's tool calls).
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
