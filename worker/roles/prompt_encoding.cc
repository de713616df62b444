#include "worker/roles/prompt_encoding.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status/status_macros.h"
#include "common/util/text.h"
#include "worker/roles/agent_rollout.h"
#include "worker/roles/supervised_rows.h"

namespace rlhfd::roles {

absl::StatusOr<model::Tokenizer> LoadJobTokenizer(const v1::JobSpec& spec) {
  const v1::ModelSpec& model_spec = spec.model();
  const std::string tokenizer_dir =
      model_spec.tokenizer_path().empty() ? model_spec.path() : model_spec.tokenizer_path();
  ASSIGN_OR_RETURN(model::Tokenizer tokenizer, model::Tokenizer::Load(tokenizer_dir));
  if (model_spec.chat_template() != "auto" && !model_spec.chat_template().empty()) {
    ASSIGN_OR_RETURN(model::ChatTemplate chat,
                     model::ChooseChatTemplate(model_spec.chat_template(), ""));
    tokenizer.set_chat_template(chat);
  }
  return tokenizer;
}

model::ChatMessage ChatMessageOf(const v1::ChatTurn& turn) {
  model::ChatMessage message{turn.role(), turn.content()};
  for (const v1::ChatToolCall& call : turn.tool_calls()) {
    message.tool_calls.push_back(
        {call.name(), call.arguments_json(),
         call.has_arguments_text() ? std::optional(call.arguments_text()) : std::nullopt});
  }
  if (turn.has_reasoning_content()) message.reasoning_content = turn.reasoning_content();
  return message;
}

model::ChatOptions ChatOptionsOf(const v1::DataSpec& data, const v1::PromptRow* row) {
  model::ChatOptions options;
  if (row != nullptr && row->has_enable_thinking()) {
    options.enable_thinking = row->enable_thinking();
  } else if (data.has_enable_thinking()) {
    options.enable_thinking = data.enable_thinking();
  }
  return options;
}

absl::StatusOr<EncodedPrompt> EncodePrompt(const model::Tokenizer& tokenizer,
                                           const v1::PromptRow& prompt, const v1::DataSpec& data,
                                           int64_t index, absl::Span<const std::string> tools) {
  const auto invalid = [index](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("prompt ", index, ": ", what));
  };
  EncodedPrompt encoded;
  bool add_special_tokens = false;
  if (prompt.chat_size() > 0) {
    std::vector<model::ChatMessage> messages;
    for (const v1::ChatTurn& turn : prompt.chat()) {
      if (turn.role().empty()) return invalid("a chat turn has no role");
      messages.push_back(ChatMessageOf(turn));
    }
    // A conversation that lists its own tools (data.tools_key), none included, shows those.
    const std::vector<std::string> row_tools(prompt.tools_json().begin(),
                                             prompt.tools_json().end());
    const absl::Span<const std::string> listed =
        prompt.tools_given() || !row_tools.empty() ? absl::MakeConstSpan(row_tools) : tools;
    absl::StatusOr<std::string> text = tokenizer.ApplyChatTemplate(
        messages, /*add_generation_prompt=*/true, listed, ChatOptionsOf(data, &prompt));
    if (!text.ok()) return invalid(text.status().message());
    encoded.text = *std::move(text);
  } else {
    // A plain-text prompt is tokenized as the tokenizer would by default (BOS where it adds one).
    encoded.text = prompt.text();
    add_special_tokens = true;
  }
  if (!IsValidUtf8(encoded.text)) return invalid("the text is not valid UTF-8");
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(encoded.text, add_special_tokens);
  if (!ids.ok()) return invalid(ids.status().message());
  if (ids->empty()) return invalid("the prompt is empty");
  const int64_t limit = data.max_prompt_length();
  const int64_t length = static_cast<int64_t>(ids->size());
  auto begin = ids->begin(), end = ids->end();
  if (length > limit) {
    switch (data.truncation()) {
      case v1::TRUNCATION_LEFT:
        begin = end - limit;
        break;
      case v1::TRUNCATION_RIGHT:
        end = begin + limit;
        break;
      default:
        return invalid(absl::StrCat(
            length, " tokens is longer than data.max_prompt_length (", limit,
            "); raise it, set data.truncation to left or right, or data.filter_overlong_prompts"));
    }
  }
  encoded.ids.assign(begin, end);
  return encoded;
}

absl::StatusOr<v1::MeasurePromptsReply> PromptMeasurer::Measure(
    const v1::MeasurePromptsRequest& request) {
  const v1::ModelSpec& model = request.spec().model();
  const std::string dir = model.tokenizer_path().empty() ? model.path() : model.tokenizer_path();
  if (!tokenizer_ || tokenizer_dir_ != dir) {
    ASSIGN_OR_RETURN(model::Tokenizer tokenizer, model::Tokenizer::Load(dir));
    tokenizer_ = std::make_unique<model::Tokenizer>(std::move(tokenizer));
    tokenizer_dir_ = dir;
  }
  // A multi-turn job's prompts list its tools: measured with them. Read for each request (a
  // small file), so that a job without multi_turn, or an edited tool config, is never measured
  // with another's tools.
  ASSIGN_OR_RETURN(const std::vector<std::string> tools, PromptTools(request.spec()));
  v1::DataSpec untruncated = request.spec().data();
  untruncated.set_max_prompt_length(std::numeric_limits<int32_t>::max());
  untruncated.set_truncation(v1::TRUNCATION_ERROR);
  v1::MeasurePromptsReply reply;
  for (int i = 0; i < request.prompts_size(); ++i) {
    ASSIGN_OR_RETURN(const EncodedPrompt encoded,
                     EncodePrompt(*tokenizer_, request.prompts(i), untruncated,
                                  request.first_prompt() + i, tools));
    reply.add_tokens(static_cast<int64_t>(encoded.ids.size()));
    // trainer.mode sft: the conversation's target as its step will encode it (the response
    // budget, data.truncation, the rollout's rules), so that a bad one is named now.
    if (request.prompts(i).target_size() > 0) {
      RETURN_IF_ERROR(
          EncodeTarget(*tokenizer_, request.prompts(i), request.spec(), request.first_prompt() + i)
              .status());
    }
  }
  return reply;
}

}  // namespace rlhfd::roles
