// Chat templates: what rlhfd reads of a model's Jinja template (ChatMlStyle, Llama3Style) and
// the Tokenizer methods that render chats as transformers' apply_chat_template does with it.
#include <algorithm>
#include <ctime>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status/status_macros.h"
#include "common/util/text.h"
#include "worker/model/tokenizer.h"
#include "worker/model/tokenizer_internal.h"

namespace rlhfd::model {

ChatTemplate Tokenizer::chat_template() const { return impl_->chat; }

bool Tokenizer::hermes_tool_format() const {
  return impl_->chat == ChatTemplate::kChatMl && impl_->chatml.hermes;
}

void Tokenizer::set_chat_template(ChatTemplate chat_template, std::string default_system) {
  impl_->chat = chat_template;
  impl_->default_system = std::move(default_system);
  impl_->refused_template.clear();
}

namespace tokenizer_internal {
namespace {

// Where the template's last {% if ... %} (or elif) tag that tests `name` starts: Qwen's
// "{%- if add_generation_prompt %}", OLMo's "{% if loop.last and add_generation_prompt %}"; npos
// where no tag tests it (a mention in a comment or a {% set %} does not count).
size_t LastTestOf(absl::string_view jinja, absl::string_view name) {
  for (size_t at = jinja.rfind(name); at != absl::string_view::npos && at > 0;
       at = jinja.rfind(name, at - 1)) {
    const size_t tag = jinja.rfind("{%", at);
    if (tag == absl::string_view::npos) break;
    const absl::string_view head = jinja.substr(tag, at - tag);  // "{%- if loop.last and "
    if (absl::StrContains(head, "%}")) continue;                 // not inside the tag
    const absl::string_view words =
        absl::StripLeadingAsciiWhitespace(absl::StripPrefix(absl::StripPrefix(head, "{%"), "-"));
    if (absl::StartsWith(words, "if ") || absl::StartsWith(words, "elif ")) return tag;
  }
  return absl::string_view::npos;
}

// The template's source from its last test of add_generation_prompt to its end: what it writes
// for a generation prompt ("" where nothing tests it).
absl::string_view GenerationPromptSource(absl::string_view jinja) {
  const size_t test = LastTestOf(jinja, "add_generation_prompt");
  return test == absl::string_view::npos ? "" : jinja.substr(test);
}

// The text of the template's first string literal (in either quote) that starts with `start`,
// after it, up to an escaped newline or the literal's end; "" where there is none.
std::string LiteralAfter(absl::string_view jinja, absl::string_view start) {
  for (const char quote : {'"', '\''}) {
    const std::string opening = absl::StrCat(absl::string_view(&quote, 1), start);
    const size_t at = jinja.find(opening);
    if (at == absl::string_view::npos) continue;
    const absl::string_view rest = jinja.substr(at + opening.size());
    return std::string(rest.substr(0, std::min({rest.find("\\n"), rest.find(quote), rest.size()})));
  }
  return "";
}

// The string literal right after `prefix` (`set date_string = "26 Jul 2024"`), in either quote.
std::string LiteralValueAfter(absl::string_view jinja, absl::string_view prefix) {
  const size_t at = jinja.find(prefix);
  if (at == absl::string_view::npos || at + prefix.size() >= jinja.size()) return "";
  const char quote = jinja[at + prefix.size()];
  if (quote != '"' && quote != '\'') return "";
  const absl::string_view rest = jinja.substr(at + prefix.size() + 1);
  const size_t close = rest.find(quote);
  return close == absl::string_view::npos ? "" : std::string(rest.substr(0, close));
}

}  // namespace

ChatMlStyle ChatMlStyle::OfTemplate(absl::string_view jinja) {
  const bool thinking_turns = absl::StrContains(jinja, "last_query_index") &&
                              absl::StrContains(jinja, "reasoning_content") &&
                              absl::StrContains(jinja, "<think>");
  // A string literal of the generation prompt that ends in "<think>" or in "<think>" and a newline
  // (the Jinja source's, escaped) opens the block, in a branch of its own or not.
  const absl::string_view generation_prompt = GenerationPromptSource(jinja);
  bool opens = false;
  for (absl::string_view opening :
       {R"(<think>')", R"(<think>")", R"(<think>\n')", R"(<think>\n")"}) {
    opens = opens || absl::StrContains(generation_prompt, opening);
  }
  // How Qwen3's template writes an answer's block (and Qwen3-Thinking-2507's, the same text).
  constexpr absl::string_view kQwen3ThinkBlock =
      R"('\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n'))";
  const bool known = !opens || (thinking_turns && absl::StrContains(jinja, kQwen3ThinkBlock));
  return {.hermes = absl::StrContains(jinja, "<tool_response>"),
          .thinking_turns = thinking_turns,
          .arguments_as_given = absl::StrContains(jinja, "arguments is string"),
          .thinking_switch = thinking_turns && absl::StrContains(jinja, "enable_thinking is false"),
          .opens_think = opens && known,
          .think_rules_known = known};
}

Llama3Style Llama3Style::OfTemplate(absl::string_view jinja) {
  Llama3Style style;
  style.knowledge_date = LiteralAfter(jinja, "Cutting Knowledge Date: ");
  if (style.knowledge_date.empty()) return style;
  style.date = LiteralValueAfter(jinja, "set date_string = ");
  style.date_format = LiteralValueAfter(jinja, "strftime_now(");
  // Llama 3.1's, 3.2's and 3.3's layout, piece by piece: the first message's trimmed text as
  // the system message and none otherwise (no default), written after the date whatever it
  // holds (no test of it), and every other turn's text trimmed.
  style.known = absl::StrContains(jinja, "set system_message = messages[0]['content']|trim") &&
                (absl::StrContains(jinja, R"(set system_message = "")") ||
                 absl::StrContains(jinja, "set system_message = ''")) &&
                LastTestOf(jinja, "system_message") == absl::string_view::npos &&
                absl::StrContains(jinja, "{{- system_message }}") &&
                absl::StrContains(jinja, R"("Today Date: " + date_string)") &&
                absl::StrContains(jinja, "message['content'] | trim + '<|eot_id|>'") &&
                !(style.date.empty() && style.date_format.empty());
  style.system_block = style.known;  // an unknown layout renders without it where forced
  return style;
}

}  // namespace tokenizer_internal

namespace {

using tokenizer_internal::ChatMlStyle;
using tokenizer_internal::Llama3Style;

constexpr absl::string_view kNoChatTemplate =
    "this tokenizer has no chat template; set model.chat_template (chatml, llama3) or give "
    "plain-text prompts";
constexpr absl::string_view kThinkOpen = "<think>";
constexpr absl::string_view kThinkClose = "</think>";
constexpr absl::string_view kEmptyThinkBlock = "<think>\n\n</think>\n\n";
constexpr absl::string_view kThinkOpenLine = "<think>\n";

// Python's str.strip / lstrip / rstrip of newlines, as Qwen3's template applies them.
absl::string_view LstripNewlines(absl::string_view text) {
  while (!text.empty() && text.front() == '\n') text.remove_prefix(1);
  return text;
}
absl::string_view RstripNewlines(absl::string_view text) {
  while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  return text;
}

// Qwen3's reading of an assistant message: its reasoning_content, or else the text of a
// <think>...</think> block in its content (before the first </think>, after the last <think>
// there), and the content after the last </think>.
struct ReasonedContent {
  std::string reasoning;
  std::string content;
};
ReasonedContent SplitReasoning(const ChatMessage& message) {
  if (message.reasoning_content.has_value()) return {*message.reasoning_content, message.content};
  const absl::string_view content = message.content;
  const size_t first_close = content.find(kThinkClose);
  if (first_close == absl::string_view::npos) return {"", message.content};
  absl::string_view reasoning = RstripNewlines(content.substr(0, first_close));
  if (const size_t open = reasoning.rfind(kThinkOpen); open != absl::string_view::npos) {
    reasoning.remove_prefix(open + kThinkOpen.size());
  }
  const size_t last_close = content.rfind(kThinkClose);
  return {std::string(LstripNewlines(reasoning)),
          std::string(LstripNewlines(content.substr(last_close + kThinkClose.size())))};
}

// Qwen3's last user query: the last user message that is not tool output wrapped in
// <tool_response> tags; messages.size() - 1 when there is none (no message comes after it).
size_t LastQueryIndex(const std::vector<ChatMessage>& messages) {
  for (size_t i = messages.size(); i-- > 0;) {
    if (IsUserQuery(messages[i])) return i;
  }
  return messages.empty() ? 0 : messages.size() - 1;
}

bool ThinkingOff(const ChatMlStyle& style, const ChatOptions& options) {
  return style.thinking_switch && options.enable_thinking == false;
}

// The generation prompt: "<|im_start|>assistant\n", then with thinking off the empty block, or
// the opening of the block where the template opens it.
std::string ChatMlGenerationPrompt(const ChatMlStyle& style, const ChatOptions& options) {
  return absl::StrCat("<|im_start|>assistant\n", ThinkingOff(style, options) ? kEmptyThinkBlock
                                                 : style.opens_think         ? kThinkOpenLine
                                                                             : "");
}

// An assistant message's text after "<|im_start|>assistant\n": its content, then each call as
// Qwen's templates print it ("\n" between blocks, and after non-empty content). With Qwen3's
// template the content is without its reasoning, and after the reasoning's <think> block when
// `think_block`.
std::string ChatMlAssistantBody(const ChatMessage& message, const ChatMlStyle& style,
                                bool think_block) {
  ReasonedContent reasoned{"", message.content};
  if (style.thinking_turns) reasoned = SplitReasoning(message);
  std::string out =
      think_block ? absl::StrCat("<think>\n", LstripNewlines(RstripNewlines(reasoned.reasoning)),
                                 "\n</think>\n\n", LstripNewlines(reasoned.content))
                  : reasoned.content;
  for (size_t i = 0; i < message.tool_calls.size(); ++i) {
    const ChatToolCall& call = message.tool_calls[i];
    const std::string& arguments = style.arguments_as_given && call.arguments_text.has_value()
                                       ? *call.arguments_text
                                       : call.arguments_json;
    absl::StrAppend(&out, i > 0 || !reasoned.content.empty() ? "\n" : "",
                    "<tool_call>\n{\"name\": \"", call.name, "\", \"arguments\": ", arguments,
                    "}\n</tool_call>");
  }
  return out;
}

// Whether Qwen3's template prints the assistant message `index` of `messages` in a <think>
// block: after the last user query, and the last message or one with reasoning.
bool ThinkBlock(const std::vector<ChatMessage>& messages, size_t index, size_t last_query) {
  return index > last_query &&
         (index + 1 == messages.size() || !SplitReasoning(messages[index]).reasoning.empty());
}

// ChatML turns for `messages` from `begin` on (the system header aside), as Qwen's templates
// render them when `style.hermes`, else as plain ChatML (a turn per message, whatever its role).
std::string ChatMlTurns(const std::vector<ChatMessage>& messages, size_t begin,
                        const ChatMlStyle& style) {
  const size_t last_query = LastQueryIndex(messages);
  std::string out;
  for (size_t i = begin; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (message.role == "tool" && style.hermes) {
      if (i == begin || messages[i - 1].role != "tool") out += "<|im_start|>user";
      absl::StrAppend(&out, "\n<tool_response>\n", message.content, "\n</tool_response>");
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
      continue;
    }
    const std::string body =
        message.role == "assistant"
            ? ChatMlAssistantBody(message, style,
                                  style.thinking_turns && ThinkBlock(messages, i, last_query))
            : message.content;
    absl::StrAppend(&out, "<|im_start|>", message.role, "\n", body, "<|im_end|>\n");
  }
  return out;
}

// Templates other than Qwen's render any role's turn, a tool message's too, but no structured
// tool calls (Llama 3.1's tool format is another).
absl::Status NoToolCallFormat() {
  return absl::InvalidArgumentError(
      "structured tool calls are rendered by templates with Qwen's hermes format (<tool_call>, "
      "<tool_response>: Qwen2.5, Qwen3) only; this model's chat template has none");
}

absl::Status CheckNoToolCalls(const std::vector<ChatMessage>& messages) {
  for (const ChatMessage& message : messages) {
    if (!message.tool_calls.empty()) return NoToolCallFormat();
  }
  return absl::OkStatus();
}

// Llama 3's turns for `messages` from `begin` on. Llama 3.1's template writes a tool message as
// an "ipython" turn of its JSON-quoted text, which is not rendered here: refused.
absl::StatusOr<std::string> Llama3Turns(const std::vector<ChatMessage>& messages, size_t begin,
                                        const Llama3Style& style) {
  std::string out;
  for (size_t i = begin; i < messages.size(); ++i) {
    const ChatMessage& message = messages[i];
    if (style.system_block && (message.role == "tool" || message.role == "ipython")) {
      return absl::InvalidArgumentError(
          "a tool message: Llama 3.1's template writes tool output as an ipython turn, which "
          "rlhfd does not render");
    }
    absl::StrAppend(&out, "<|start_header_id|>", message.role, "<|end_header_id|>\n\n",
                    StripPythonWhitespace(message.content), "<|eot_id|>");
  }
  return out;
}

// Llama 3.1's opening system turn, with `system` (the system message, trimmed).
std::string Llama3SystemBlock(const Llama3Style& style, absl::string_view system) {
  std::string date = style.date;
  // strftime_now: today, in local time, as transformers has it. A format C's strftime cannot fill
  // (empty, or over 127 bytes) leaves the fixed date; %Z, %z and %f are C's, not Python's.
  if (!style.date_format.empty()) {
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    char text[128];
    if (localtime_r(&now, &local) != nullptr &&
        std::strftime(text, sizeof(text), style.date_format.c_str(), &local) > 0) {
      date = text;
    }
  }
  return absl::StrCat("<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: ",
                      style.knowledge_date, "\nToday Date: ", date, "\n\n", system, "<|eot_id|>");
}

}  // namespace

bool IsUserQuery(const ChatMessage& message) {
  return message.role == "user" && !(absl::StartsWith(message.content, "<tool_response>") &&
                                     absl::EndsWith(message.content, "</tool_response>"));
}

absl::StatusOr<std::string> Tokenizer::ApplyChatTemplate(const std::vector<ChatMessage>& messages,
                                                         bool add_generation_prompt,
                                                         absl::Span<const std::string> tools,
                                                         const ChatOptions& options) const {
  if (!tools.empty() && impl_->chat != ChatTemplate::kChatMl) {
    return absl::InvalidArgumentError(
        "tools are listed in the prompt by ChatML templates (Qwen's hermes format) only; this "
        "model's chat template is another");
  }
  std::string out;
  switch (impl_->chat) {
    case ChatTemplate::kChatMl: {
      const bool has_system = !messages.empty() && messages[0].role == "system";
      const std::string& system = has_system ? messages[0].content : impl_->default_system;
      if (!tools.empty()) {
        // Qwen2.5 and Qwen3's tool block, the system text (if any) before it.
        // Qwen2.5's template writes its default system text when there is no system message;
        // Qwen3's (no default) writes nothing then; a system message, even empty, is followed
        // by a blank line.
        absl::StrAppend(
            &out, "<|im_start|>system\n", system, has_system || !system.empty() ? "\n\n" : "",
            "# Tools\n\nYou may call one or more functions to assist with the user "
            "query.\n\nYou are provided with function signatures within <tools></tools> "
            "XML tags:\n<tools>");
        for (const std::string& tool : tools) absl::StrAppend(&out, "\n", tool);
        out +=
            "\n</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
            "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
      } else if (!has_system && !system.empty()) {
        absl::StrAppend(&out, "<|im_start|>system\n", system, "<|im_end|>\n");
      }
      if (!impl_->chatml.hermes) RETURN_IF_ERROR(CheckNoToolCalls(messages));
      // With tools the system message is inside the tool block.
      out += ChatMlTurns(messages, has_system && !tools.empty() ? 1 : 0, impl_->chatml);
      if (add_generation_prompt) out += ChatMlGenerationPrompt(impl_->chatml, options);
      return out;
    }
    case ChatTemplate::kLlama3: {
      RETURN_IF_ERROR(CheckNoToolCalls(messages));
      const Llama3Style& style = impl_->llama3;
      const bool has_system =
          style.system_block && !messages.empty() && messages[0].role == "system";
      ASSIGN_OR_RETURN(const std::string turns, Llama3Turns(messages, has_system ? 1 : 0, style));
      out = impl_->bos_token;
      if (style.system_block) {
        out +=
            Llama3SystemBlock(style, has_system ? StripPythonWhitespace(messages[0].content) : "");
      }
      out += turns;
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    }
    case ChatTemplate::kNone:
      break;
  }
  return NoChatTemplate();
}

absl::StatusOr<std::string> Tokenizer::ApplyChatTemplateContinuation(
    const std::vector<ChatMessage>& messages, const ChatOptions& options) const {
  for (const ChatMessage& message : messages) {
    if (message.role != "user" && message.role != "tool") {
      return absl::InvalidArgumentError(
          absl::StrCat("a '", message.role,
                       "' message where a conversation goes on after an assistant turn "
                       "(user and tool messages only)"));
    }
  }
  switch (impl_->chat) {
    case ChatTemplate::kChatMl:
      // The newline the template writes after the assistant turn's <|im_end|>.
      return absl::StrCat("\n", ChatMlTurns(messages, 0, impl_->chatml),
                          ChatMlGenerationPrompt(impl_->chatml, options));
    case ChatTemplate::kLlama3: {
      ASSIGN_OR_RETURN(const std::string turns, Llama3Turns(messages, 0, impl_->llama3));
      return absl::StrCat(turns, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    }
    case ChatTemplate::kNone:
      break;
  }
  return NoChatTemplate();
}

absl::StatusOr<std::string> Tokenizer::ApplyChatTemplateToolResponses(
    absl::Span<const std::string> responses, const ChatOptions& options) const {
  if (impl_->chat != ChatTemplate::kChatMl) {
    return absl::InvalidArgumentError(
        "tool responses are rendered for ChatML templates (Qwen's hermes format) only; this "
        "model's chat template is another");
  }
  // What multi_turn's format: hermes inserts, whatever the template.
  std::vector<ChatMessage> messages;
  for (const std::string& response : responses) messages.push_back({"tool", response});
  ChatMlStyle hermes = impl_->chatml;
  hermes.hermes = true;
  return absl::StrCat(ChatMlTurns(messages, 0, hermes),
                      ChatMlGenerationPrompt(impl_->chatml, options));
}

absl::StatusOr<std::string> Tokenizer::ApplyChatTemplateAssistantTurn(
    const ChatMessage& message, AnswerText text, const ChatOptions& options) const {
  switch (impl_->chat) {
    case ChatTemplate::kChatMl: {
      const ChatMlStyle& style = impl_->chatml;
      if (!message.tool_calls.empty() && !style.hermes) return NoToolCallFormat();
      if (text == AnswerText::kAsWritten) {
        ChatMessage as_written = message;
        as_written.reasoning_content = "";  // none of its own: nothing is split off the content
        return absl::StrCat(ChatMlAssistantBody(as_written, style, /*think_block=*/false),
                            "<|im_end|>");
      }
      // A template that opens the block in the generation prompt has the turn go on inside it,
      // whether or not a user query came before.
      const bool think_block =
          (style.thinking_turns && text == AnswerText::kAfterQuery) || style.opens_think;
      // With thinking off the generation prompt holds the empty block: the turn is what
      // follows it, and reasoning has no place.
      const bool in_prompt = think_block && ThinkingOff(style, options);
      if (in_prompt && !LstripNewlines(RstripNewlines(SplitReasoning(message).reasoning)).empty()) {
        return absl::InvalidArgumentError(
            "an assistant turn with reasoning (reasoning_content, or a <think> block in its "
            "content) while enable_thinking is false, which gives the turn an empty <think> "
            "block: drop the reasoning or leave enable_thinking unset");
      }
      std::string body = ChatMlAssistantBody(message, style, think_block);
      if (in_prompt) {
        body.erase(0, kEmptyThinkBlock.size());
      } else if (style.opens_think) {  // the prompt's opening line
        body.erase(0, kThinkOpenLine.size());
      }
      return absl::StrCat(body, "<|im_end|>");
    }
    case ChatTemplate::kLlama3:
      if (!message.tool_calls.empty()) return NoToolCallFormat();
      return absl::StrCat(text == AnswerText::kAsWritten ? absl::string_view(message.content)
                                                         : StripPythonWhitespace(message.content),
                          "<|eot_id|>");
    case ChatTemplate::kNone:
      break;
  }
  return NoChatTemplate();
}

absl::Status Tokenizer::NoChatTemplate() const {
  return absl::InvalidArgumentError(impl_->refused_template.empty() ? kNoChatTemplate
                                                                    : impl_->refused_template);
}

absl::StatusOr<ChatTemplate> ChooseChatTemplate(absl::string_view name, absl::string_view jinja) {
  if (name == "chatml") return ChatTemplate::kChatMl;
  if (name == "llama3") return ChatTemplate::kLlama3;
  if (name == "none") return ChatTemplate::kNone;
  if (name != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template '", name, "' is not one of: auto, chatml, llama3, none"));
  }
  if (absl::StrContains(jinja, "<|im_start|>")) return ChatTemplate::kChatMl;
  if (absl::StrContains(jinja, "<|start_header_id|>")) return ChatTemplate::kLlama3;
  return ChatTemplate::kNone;
}

}  // namespace rlhfd::model
