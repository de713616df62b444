#include "worker/roles/supervised_rows.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "worker/agent/tool_calls.h"
#include "worker/roles/prompt_encoding.h"
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
  // The row's own tools where it gives them (none included), else multi_turn's.
  const bool tools_listed = row.tools_json_size() > 0 || (!row.tools_given() && turns.enable());
  // The template's text for a piece of the target, as its tokens.
  const auto tokens =
      [&](const absl::StatusOr<std::string>& text) -> absl::StatusOr<std::vector<int32_t>> {
    if (!text.ok()) return refused(text.status().message());
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(*text);
    if (!ids.ok()) return refused(ids.status().message());
    return ids;
  };
  const model::ChatOptions options = ChatOptionsOf(spec.data(), &row);
  // Single-turn rows (data.response_key) are verl's SFTDataset's: the response as written, its
  // <think> text included, never in a block of the template's.
  const bool single_turn = !spec.data().response_key().empty();
  // Whether a user query came before (Qwen3's template puts no <think> block on an answer
  // without one).
  bool after_query =
      std::any_of(row.chat().begin(), row.chat().end(),
                  [](const v1::ChatTurn& turn) { return model::IsUserQuery(ChatMessageOf(turn)); });
  rollout::Completion out;
  std::vector<model::ChatMessage> between;  // the user and tool turns before the next answer
  int64_t assistant_turns = 0, between_groups = 0;
  bool calls_tools = false;  // whether tool turns may come next
  for (const v1::ChatTurn& turn : row.target()) {
    if (turn.role() == "tool") {
      if (!tools_listed) {
        return refused(
            "a tool turn, but the prompt lists no tools: give the row's tool schemas "
            "(data.tools_key) or roles.actor.rollout.multi_turn's tool config");
      }
      if (!tokenizer.hermes_tool_format()) {
        return refused(
            "a tool turn: tool turns are Qwen's hermes format, as multi-turn rollouts make "
            "them, and this model's chat template has none (<tool_response>: Qwen2.5, Qwen3)");
      }
      if (!calls_tools) {
        return refused(absl::StrCat(
            "a tool turn after assistant turn ", assistant_turns,
            between.empty() ? ", which calls no tool (no tool_calls, no <tool_call> block)"
                            : " and a user turn: tool turns answer the assistant turn's calls"));
      }
      // A rollout's tool responses are cut as multi_turn says; verl's SFT data keeps them whole.
      between.push_back({"tool", turns.enable()
                                     ? agent::TruncateToolResponse(
                                           turn.content(), turns.max_tool_response_length(), side)
                                     : turn.content()});
      continue;
    }
    if (turn.role() == "user") {
      between.push_back({"user", turn.content()});
      after_query = after_query || model::IsUserQuery(between.back());
      calls_tools = false;
      continue;
    }
    if (turn.role() != "assistant") {
      return refused(absl::StrCat("a '", turn.role(),
                                  "' turn among the target turns (only assistant, user and tool)"));
    }
    if (!between.empty()) {
      // The model's turn before ended with its end token, as a rollout's does.
      ASSIGN_OR_RETURN(const std::vector<int32_t> ids,
                       tokens(tokenizer.ApplyChatTemplateContinuation(between, options)));
      Append(ids, 0, out);
      between.clear();
      ++between_groups;
    }
    ++assistant_turns;
    const model::ChatMessage message = ChatMessageOf(turn);
    const agent::ParsedResponse parsed = agent::ParseHermesToolCalls(turn.content());
    calls_tools = !message.tool_calls.empty() || !parsed.calls.empty() || !parsed.malformed.empty();
    const model::AnswerText text = single_turn   ? model::AnswerText::kAsWritten
                                   : after_query ? model::AnswerText::kAfterQuery
                                                 : model::AnswerText::kWithoutQuery;
    ASSIGN_OR_RETURN(const std::vector<int32_t> ids,
                     tokens(tokenizer.ApplyChatTemplateAssistantTurn(message, text, options)));
    Append(ids, 1, out);
  }
  if (!between.empty()) {
    return refused(absl::StrCat("the target ends in a ", between.back().role,
                                " turn; end it with an assistant turn"));
  }
  if (turns.enable() && turns.max_assistant_turns() > 0 &&
      assistant_turns > turns.max_assistant_turns()) {
    return refused(absl::StrCat(assistant_turns,
                                " assistant turns, over multi_turn.max_assistant_turns (",
                                turns.max_assistant_turns(), ")"));
  }
  if (turns.enable() && turns.max_user_turns() > 0 && between_groups > turns.max_user_turns()) {
    return refused(absl::StrCat(between_groups,
                                " user or tool turns, over multi_turn.max_user_turns (",
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
