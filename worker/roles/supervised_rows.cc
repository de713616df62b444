#include "worker/roles/supervised_rows.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "worker/agent/agent_loop.h"

namespace rlhfd::roles {
namespace {

void Append(const std::vector<int32_t>& ids, uint8_t mask, rollout::Completion& out) {
  out.token_ids.insert(out.token_ids.end(), ids.begin(), ids.end());
  out.response_mask.insert(out.response_mask.end(), ids.size(), mask);
}

}  // namespace

absl::StatusOr<rollout::Completion> EncodeTarget(const model::Tokenizer& tokenizer,
                                                 const v1::PromptRow& row, const v1::DataSpec& data,
                                                 int64_t index) {
  const std::string at = absl::StrCat("prompt ", index, " of the step's batch: ");
  if (row.target_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(at, "no assistant turn to train on (trainer.mode sft reads conversations)"));
  }
  rollout::Completion out;
  std::vector<std::string> tool_responses;  // consecutive tool turns go back together
  for (const v1::ChatTurn& turn : row.target()) {
    if (turn.role() == "tool") {
      tool_responses.push_back(turn.content());
      continue;
    }
    if (turn.role() != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat(
          at, "a '", turn.role(), "' turn among the target turns (only assistant and tool)"));
    }
    if (!tool_responses.empty()) {
      // The model's turn before ended with its end token, as a rollout's does.
      absl::StatusOr<std::vector<int32_t>> inserted =
          agent::ToolTurnTokens(tokenizer, tool_responses, /*after_turn_end=*/true);
      if (!inserted.ok())
        return absl::InvalidArgumentError(absl::StrCat(at, inserted.status().message()));
      Append(*inserted, 0, out);
      tool_responses.clear();
    }
    absl::StatusOr<std::string> text = tokenizer.ApplyChatTemplateAssistantTurn(turn.content());
    if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat(at, text.status().message()));
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(*text);
    if (!ids.ok()) return absl::InvalidArgumentError(absl::StrCat(at, ids.status().message()));
    Append(*ids, 1, out);
  }
  if (!tool_responses.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(at, "the target ends in a tool turn; end it with an assistant turn"));
  }
  out.finish_reason = rollout::FinishReason::kStop;
  const int64_t limit = data.max_response_length();
  if (static_cast<int64_t>(out.token_ids.size()) > limit) {
    if (data.truncation() == v1::TRUNCATION_ERROR) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, "its target turns are ", out.token_ids.size(),
          " tokens, over data.max_response_length (", limit,
          "); raise it, or set data.truncation to left or right to train on its first ", limit));
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
    const google::protobuf::RepeatedPtrField<v1::PromptRow>& prompts, const v1::DataSpec& data,
    int64_t first_prompt) {
  std::vector<rollout::GenerationResult> results(prompts.size());
  for (int i = 0; i < prompts.size(); ++i) {
    ASSIGN_OR_RETURN(rollout::Completion target,
                     EncodeTarget(tokenizer, prompts[i], data, first_prompt + i));
    results[i].samples.push_back(std::move(target));
  }
  return results;
}

}  // namespace rlhfd::roles
