// Tokenizer: Hugging Face tokenizer.json byte-level BPE as the Llama 3 / Qwen2 families use it
// (NFC normaliser, regex Split + ByteLevel pre-tokenizers, merges, added and special tokens,
// TemplateProcessing), and their chat templates (ChatML, Llama 3 headers). No LibTorch.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <map>
#include <memory>
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
};

struct ChatMessage {
  std::string role;
  std::string content;
  std::vector<ChatToolCall> tool_calls = {};  // assistant messages (ChatML templates only)
};

enum class ChatTemplate { kNone, kChatMl, kLlama3 };

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
  absl::StatusOr<std::string> ApplyChatTemplate(const std::vector<ChatMessage>& messages,
                                                bool add_generation_prompt,
                                                absl::Span<const std::string> tools = {}) const;
  // What the template renders for `messages` (user and tool messages) after an assistant turn's
  // end token, then the generation prompt: where a conversation goes on to the next assistant
  // turn. INVALID_ARGUMENT for an assistant or system message, or one the template has no turn
  // for.
  absl::StatusOr<std::string> ApplyChatTemplateContinuation(
      const std::vector<ChatMessage>& messages) const;
  // What the template renders for consecutive tool messages with contents `responses`, then the
  // generation prompt: what follows an assistant turn that called tools, up to the next
  // assistant turn's first token (ChatML: one user turn of <tool_response> blocks).
  // INVALID_ARGUMENT for a template without tool messages.
  absl::StatusOr<std::string> ApplyChatTemplateToolResponses(
      absl::Span<const std::string> responses) const;
  // What the template renders for an assistant turn with `content` (and `tool_calls`, ChatML
  // only) after its generation prompt: the content, the calls' blocks and the token that ends
  // the turn (ChatML's <|im_end|>, Llama 3's <|eot_id|>), which is where generation stops.
  // INVALID_ARGUMENT without a chat template.
  absl::StatusOr<std::string> ApplyChatTemplateAssistantTurn(
      absl::string_view content, absl::Span<const ChatToolCall> tool_calls = {}) const;
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

// "chatml", "llama3", "none" or "auto" (detected from the template text `jinja`).
absl::StatusOr<ChatTemplate> ChooseChatTemplate(absl::string_view name, absl::string_view jinja);

}  // namespace rlhfd::model
