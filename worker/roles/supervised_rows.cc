#include "worker/roles/supervised_rows.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "worker/agent/agent_loop.h"
#include "worker/agent/tool_calls.h"
#include "worker/roles/rollout_sampling.h"

namespace rlhfd::roles {
namespace {

void Append(const std::vector<int32_t>& ids, uint8_t mask, rollout::Completion& out) {
  out.token_ids.insert(out.token_ids.end(), ids.begin(), ids.end());
  out.response_mask.insert(out.response_mask.end(), ids.size(), mask);
}

}  // namespace

absl::StatusOr<rollout::Completion> EncodeTarget(const model::Tokenizer& tokenizer,
                                                 const v1::PromptRow& row, const v1::JobSpec& spec,
                                                 int64_t index) {
  const std::string at = absl::StrCat("prompt ", index, ": ");
  const auto refused = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(at, why));
  };
  if (row.target_size() == 0) {
    return refused("no assistant turn to train on (trainer.mode sft reads conversations)");
  }
  const v1::MultiTurnSpec& turns = spec.roles().actor().rollout().multi_turn();
  ASSIGN_OR_RETURN(const agent::TruncateSide side,
                   agent::ParseTruncateSide(turns.tool_response_truncate_side()));
  rollout::Completion out;
  std::vector<std::string> tool_responses;  // consecutive tool turns go back together
  int64_t assistant_turns = 0, tool_turns = 0;
  bool calls_tools = false;  // whether the last assistant turn holds a <tool_call> block
  for (const v1::ChatTurn& turn : row.target()) {
    if (turn.role() == "tool") {
      if (!turns.enable()) {
        return refused(
            "a tool turn, without roles.actor.rollout.multi_turn: its tool config lists the "
            "tools in the prompt, as the RL job that follows shows them");
      }
      if (!calls_tools) {
        return refused(absl::StrCat("tool turns follow assistant turn ", assistant_turns,
                                    ", which has no <tool_call> block: a rollout ends there"));
      }
      tool_responses.push_back(
          agent::TruncateToolResponse(turn.content(), turns.max_tool_response_length(), side));
      continue;
    }
    if (turn.role() != "assistant") {
      return refused(absl::StrCat("a '", turn.role(),
                                  "' turn among the target turns (only assistant and tool)"));
    }
    if (!tool_responses.empty()) {
      // The model's turn before ended with its end token, as a rollout's does.
      absl::StatusOr<std::vector<int32_t>> inserted =
          agent::ToolTurnTokens(tokenizer, tool_responses, /*after_turn_end=*/true);
      if (!inserted.ok()) return refused(inserted.status().message());
      Append(*inserted, 0, out);
      tool_responses.clear();
      ++tool_turns;
    }
    ++assistant_turns;
    const agent::ParsedResponse parsed = agent::ParseHermesToolCalls(turn.content());
    calls_tools = !parsed.calls.empty() || !parsed.malformed.empty();
    absl::StatusOr<std::string> text = tokenizer.ApplyChatTemplateAssistantTurn(turn.content());
    if (!text.ok()) return refused(text.status().message());
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(*text);
    if (!ids.ok()) return refused(ids.status().message());
    Append(*ids, 1, out);
  }
  if (!tool_responses.empty()) {
    return refused("the target ends in a tool turn; end it with an assistant turn");
  }
  if (turns.max_assistant_turns() > 0 && assistant_turns > turns.max_assistant_turns()) {
    return refused(absl::StrCat(assistant_turns,
                                " assistant turns, over multi_turn.max_assistant_turns (",
                                turns.max_assistant_turns(), ")"));
  }
  if (turns.max_user_turns() > 0 && tool_turns > turns.max_user_turns()) {
    return refused(absl::StrCat(tool_turns, " tool turns, over multi_turn.max_user_turns (",
                                turns.max_user_turns(), ")"));
  }
  out.finish_reason = rollout::FinishReason::kStop;
  const int64_t limit = ResponseBudget(spec);
  if (static_cast<int64_t>(out.token_ids.size()) > limit) {
    if (spec.data().truncation() == v1::TRUNCATION_ERROR) {
      return refused(
          absl::StrCat("its target turns are ", out.token_ids.size(),
                       " tokens, over the response budget (", limit,
                       ", rollout.max_new_tokens or data.max_response_length); raise it, or set "
                       "data.truncation to left or right to train on its first ",
                       limit));
    }
    out.token_ids.resize(limit);
    out.response_mask.resize(limit);
    out.finish_reason = rollout::FinishReason::kLength;
  }
  out.logprobs.assign(out.token_ids.size(), 0.0f);
  return out;
}

absl::StatusOr<std::vector<rollout::GenerationResult>> EncodeTargets(
    const model::Tokenizer& tokenizer,
    const google::protobuf::RepeatedPtrField<v1::PromptRow>& prompts, const v1::JobSpec& spec,
    int64_t first_prompt) {
  std::vector<rollout::GenerationResult> results(prompts.size());
  for (int i = 0; i < prompts.size(); ++i) {
    ASSIGN_OR_RETURN(rollout::Completion target,
                     EncodeTarget(tokenizer, prompts[i], spec, first_prompt + i));
    results[i].samples.push_back(std::move(target));
  }
  return results;
}

}  // namespace rlhfd::roles
