// Tokenizer: Hugging Face tokenizer.json byte-level BPE as the Llama 3 / Qwen2 families use it
// (NFC normaliser, regex Split + ByteLevel pre-tokenizers, merges, added and special tokens,
// TemplateProcessing), and their chat templates (ChatML, Llama 3 headers). No LibTorch.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace rlhfd::model {

// A structured tool call of an assistant message (OpenAI's layout): what the chat template's
// hermes block prints, the arguments as its `tojson` prints them (PythonJsonDumps).
struct ChatToolCall {
  std::string name;
  std::string arguments_json;
  // The arguments as the data gave them when that was JSON text (OpenAI's API layout): Qwen3's
  // template prints such text as it is; Qwen2.5's prints arguments_json (its `tojson` would
  // quote the text, which no model is trained to write).
  std::optional<std::string> arguments_text = std::nullopt;
};

struct ChatMessage {
  std::string role;
  std::string content;
  std::vector<ChatToolCall> tool_calls = {};  // assistant messages (ChatML templates only)
  // An assistant message's reasoning (OpenAI's and vLLM's reasoning_content), which Qwen3's
  // template prints in a <think> block; without it that template takes the reasoning from a
  // <think>...</think> block in the content.
  std::optional<std::string> reasoning_content = std::nullopt;
};

// What the chat template reads beside the messages (transformers' apply_chat_template keyword
// arguments, verl's data.apply_chat_template_kwargs).
struct ChatOptions {
  // Qwen3's thinking switch: false ends each generation prompt with an empty <think> block
  // (templates that read enable_thinking); unset or true leave the template's default.
  std::optional<bool> enable_thinking = std::nullopt;
};

enum class ChatTemplate { kNone, kChatMl, kLlama3 };

// Which text of an answer Tokenizer::ApplyChatTemplateAssistantTurn gives.
enum class AnswerText {
  kAfterQuery,    // the template's, for an answer a user query came before
  kWithoutQuery,  // the template's, for one none came before (Qwen3's then prints no <think>)
  kAsWritten,     // its content as written, <think> text included (verl's SFTDataset's response)
};

class Tokenizer {
 public:
  // Parses tokenizer.json text; `source` names the file in errors. Refuses models, normalisers,
  // pre-tokenizers and post-processors other than those these families use, by name.
  static absl::StatusOr<Tokenizer> FromJson(absl::string_view json, absl::string_view source);
  // <dir>/tokenizer.json, with the chat template from tokenizer_config.json or
  // chat_template.jinja.
  static absl::StatusOr<Tokenizer> Load(const std::string& dir);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // INVALID_ARGUMENT for text that is not UTF-8.
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens = false) const;
  // Invalid UTF-8 from byte-level pieces becomes U+FFFD, as in Hugging Face.
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens = false) const;

  // -1 when unknown.
  int32_t TokenToId(absl::string_view token) const;
  // One past the largest token id the tokenizer can produce (vocabulary and added tokens).
  int64_t vocab_size() const;

  // The prompt text for `messages` in the model's chat format; INVALID_ARGUMENT without one.
  // `tools`: the function schemas a multi-turn rollout offers, each as the JSON text the
  // template's `tojson` prints (PythonJsonDumps), listed in the system turn as Qwen's
  // templates do. Tool messages and assistant tool calls are rendered as Qwen2.5's template
  // renders them: consecutive tool messages as one user turn of <tool_response> blocks, each
  // call as a <tool_call> block after the content (hermes_tool_format; other templates give any
  // role a plain turn and have no structured calls: INVALID_ARGUMENT for those).
  // Qwen3's template prints an assistant message after the last user query in a <think> block
  // when it is the last message or has reasoning, and drops the reasoning of the others.
  absl::StatusOr<std::string> ApplyChatTemplate(const std::vector<ChatMessage>& messages,
                                                bool add_generation_prompt,
                                                absl::Span<const std::string> tools = {},
                                                const ChatOptions& options = {}) const;
  // What the template renders for `messages` (user and tool messages) after an assistant turn's
  // end token, then the generation prompt: where a conversation goes on to the next assistant
  // turn. INVALID_ARGUMENT for an assistant or system message, or one the template has no turn
  // for.
  absl::StatusOr<std::string> ApplyChatTemplateContinuation(
      const std::vector<ChatMessage>& messages, const ChatOptions& options = {}) const;
  // What the template renders for consecutive tool messages with contents `responses`, then the
  // generation prompt: what follows an assistant turn that called tools, up to the next
  // assistant turn's first token (ChatML: one user turn of <tool_response> blocks).
  // INVALID_ARGUMENT for a template without tool messages.
  absl::StatusOr<std::string> ApplyChatTemplateToolResponses(
      absl::Span<const std::string> responses, const ChatOptions& options = {}) const;
  // What the template renders for the assistant `message` (its tool calls: ChatML only) after
  // its generation prompt when it is the turn being generated, the last of the conversation: the
  // content, the calls' blocks and the token that ends the turn (ChatML's <|im_end|>, Llama 3's
  // <|eot_id|>), which is where generation stops. With Qwen3's template the content follows a
  // <think> block of its reasoning, empty if it has none (`text` kAfterQuery); when `options`
  // turn thinking off, the generation prompt holds that empty block and a message with reasoning
  // is INVALID_ARGUMENT. With Qwen3-Thinking-2507's the generation prompt opened the block, so
  // the turn goes on inside it, a query before or not. INVALID_ARGUMENT without a chat template.
  absl::StatusOr<std::string> ApplyChatTemplateAssistantTurn(
      const ChatMessage& message, AnswerText text = AnswerText::kAfterQuery,
      const ChatOptions& options = {}) const;
  ChatTemplate chat_template() const;
  // Whether the chat template renders tool messages and structured calls in Qwen's hermes format
  // (its Jinja has <tool_response> blocks: Qwen2.5, Qwen3). Other ChatML templates give a tool
  // message a plain turn and refuse structured calls.
  bool hermes_tool_format() const;
  void set_chat_template(ChatTemplate chat_template, std::string default_system = "");

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  static absl::StatusOr<Tokenizer> FromParsedJson(const nlohmann::json& root,
                                                  absl::string_view source);
  // Why there is no chat template to render: none was found, or the one found is refused.
  absl::Status NoChatTemplate() const;
  std::unique_ptr<Impl> impl_;
};

// What rlhfd reads of tokenizer_config.json.
struct TokenizerConfig {
  std::string chat_template;  // Jinja text; empty when none (or a list of named templates)
  std::string bos_token;
};
absl::StatusOr<TokenizerConfig> ParseTokenizerConfig(absl::string_view text,
                                                     absl::string_view source);

// A model whose tokenizer can produce ids the embedding has no row for would read out of bounds
// on the first such token: refused when the two are loaded together. `model_vocab_size` is
// config.json's vocab_size; `dir` names the model in the error.
absl::Status CheckTokenizerFitsModel(const Tokenizer& tokenizer, int64_t model_vocab_size,
                                     absl::string_view dir);

// Whether `message` is a user query as Qwen3's template counts them (the <think> blocks go on the
// assistant turns after the last one): a user message that is not tool output wrapped in
// <tool_response> tags.
bool IsUserQuery(const ChatMessage& message);

// "chatml", "llama3", "none" or "auto" (detected from the template text `jinja`).
absl::StatusOr<ChatTemplate> ChooseChatTemplate(absl::string_view name, absl::string_view jinja);

}  // namespace rlhfd::model
