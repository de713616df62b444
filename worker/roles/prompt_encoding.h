// Prompts as the model sees them: a chat through the model's chat template (with the generation
// prompt, as verl's RLHFDataset), or plain text; tokenized and cut to data.max_prompt_length as
// data.truncation says.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "rlhfd/v1/worker_service.pb.h"
#include "worker/model/tokenizer.h"

namespace rlhfd::roles {

// The job's tokenizer: model.tokenizer_path (or model.path), with model.chat_template when it
// names one.
absl::StatusOr<model::Tokenizer> LoadJobTokenizer(const v1::JobSpec& spec);

// A data file's chat turn (with its structured tool calls) as the tokenizer renders it.
model::ChatMessage ChatMessageOf(const v1::ChatTurn& turn);

// What the chat template reads beside the messages: data.enable_thinking, or `row`'s own
// (trainer.mode sft, data.enable_thinking_key) where it has one.
model::ChatOptions ChatOptionsOf(const v1::DataSpec& data, const v1::PromptRow* row = nullptr);

struct EncodedPrompt {
  std::string text;  // the model's input as text (template applied)
  std::vector<int64_t> ids;
};

// INVALID_ARGUMENT naming prompt `index` (of the step's batch): an empty prompt, a chat turn
// without a role, text that is not UTF-8, or (truncation "error") one longer than
// max_prompt_length, with its length. `tools`: the schemas a multi-turn rollout lists in a chat
// prompt (PromptTools), unless the row gives its own, none included (PromptRow.tools_given,
// trainer.mode sft).
absl::StatusOr<EncodedPrompt> EncodePrompt(const model::Tokenizer& tokenizer,
                                           const v1::PromptRow& prompt, const v1::DataSpec& data,
                                           int64_t index, absl::Span<const std::string> tools = {});

// MeasurePrompts: each prompt's token count, measured whole (no truncation: the limit is what
// the controller checks). The tokenizer last loaded is kept, since a job measures in chunks.
class PromptMeasurer {
 public:
  absl::StatusOr<v1::MeasurePromptsReply> Measure(const v1::MeasurePromptsRequest& request);

 private:
  std::string tokenizer_dir_;
  std::unique_ptr<model::Tokenizer> tokenizer_;
};

}  // namespace rlhfd::roles
