// The tokenizer's internals, shared by its files and no one else: UTF-8 and GPT-2 byte-map
// helpers, the pre-tokenizer regex, and Tokenizer::Impl. tokenizer_json.cc builds an Impl from
// tokenizer.json; tokenizer.cc encodes and decodes with it; tokenizer_text.cc holds the helpers.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/model/tokenizer.h"

namespace rlhfd::model {
namespace tokenizer_internal {

// GPT-2's pattern, used by ByteLevel pre-tokenizers with use_regex.
inline constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

void AppendUtf8(uint32_t cp, std::string* out);
// Decodes one UTF-8 sequence at `i`. Returns its length and sets `cp`, or returns the length of
// the maximal invalid subpart (>= 1) with cp = UINT32_MAX (Unicode's substitution practice,
// which Rust's from_utf8_lossy follows).
size_t DecodeUtf8(absl::string_view s, size_t i, uint32_t* cp);
bool IsValidUtf8(absl::string_view s);
// Invalid sequences become U+FFFD.
std::string LossyUtf8(absl::string_view s);

// GPT-2's reversible byte → printable-character map, and its inverse.
struct ByteMap {
  std::string to_unicode[256];
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteMap();
};
const ByteMap& Bytes();

struct RegexDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
using Regex = std::shared_ptr<pcre2_code>;

absl::StatusOr<Regex> CompileRegex(const std::string& pattern, absl::string_view source);
// Splits `text` into matches and the gaps between them ("Isolated" behaviour), in order.
void SplitIsolated(const Regex& regex, absl::string_view text, std::vector<std::string>* out);

// Unicode White_Space (what tokenizers' lstrip / rstrip test, Rust's char::is_whitespace).
bool IsWhitespace(uint32_t c);
// The code point starting at byte `i` of valid UTF-8 `text`, and its length.
std::pair<uint32_t, size_t> CodePointAt(absl::string_view text, size_t i);
// Where the whitespace run ending at `end` starts, not before `floor`.
size_t WhitespaceRunStart(absl::string_view text, size_t floor, size_t end);
// Where the whitespace run starting at `begin` ends.
size_t WhitespaceRunEnd(absl::string_view text, size_t begin);

struct PreTokenizerStep {
  enum Kind { kSplit, kByteLevel } kind;
  Regex regex;  // kSplit, or kByteLevel with use_regex
  bool add_prefix_space = false;
};

struct AddedToken {
  int32_t id;
  std::string content;
  bool special;
  bool lstrip = false;  // The whitespace right before it belongs to the token (is dropped).
  bool rstrip = false;  // The whitespace right after it does.
};

// What of Qwen's rules a ChatML template follows, read from its Jinja text.
struct ChatMlStyle {
  // Tool messages and calls in Qwen's hermes format (<tool_response>, <tool_call>), as Qwen2.5's
  // and Qwen3's templates render them; plain ChatML ones (Qwen2, SmolLM2) give a tool message a
  // turn of its own and print no calls.
  bool hermes = false;
  // Qwen3's: an assistant message after the last user query in a <think> block (when it is the
  // last message or has reasoning), the reasoning of the others dropped.
  bool thinking_turns = false;
  // Qwen3's: arguments given as JSON text printed as they are.
  bool arguments_as_given = false;
  // Qwen3's: enable_thinking false ends the generation prompt with an empty <think> block.
  bool thinking_switch = false;
  // Qwen3-Thinking-2507's: the generation prompt opens a <think> block, so the turn generated
  // after it is its reasoning, "</think>", then its answer.
  bool opens_think = false;
  // False for a template whose generation prompt opens a <think> block while its answers' blocks
  // are laid out otherwise than Qwen3's template writes them (QwQ's drops the reasoning of all
  // but the last answer; Qwen3.5's; OLMo 3 Think's), which Tokenizer::Load refuses;
  // model.chat_template: chatml renders it anyway, without the opening (opens_think is false).
  bool think_rules_known = true;

  static ChatMlStyle OfTemplate(absl::string_view jinja);
};

// What of Llama 3.1's rules a Llama 3 template follows, read from its Jinja text.
struct Llama3Style {
  // Llama 3.1's, 3.2's and 3.3's: every conversation opens with a system turn of the knowledge
  // cutoff, the date and the system message (the first message's, trimmed; "" without one).
  bool system_block = false;
  std::string knowledge_date;  // "December 2023"
  std::string date;            // the template's date_string default ("26 Jul 2024")
  // strftime_now's format where the template asks for today's date (3.2's "%d %b %Y"), which
  // transformers renders in local time; "" for the fixed date.
  std::string date_format;
  // False for a template with the cutoff line laid out otherwise than those (a system block only
  // with a system message, say), which Tokenizer::Load refuses; model.chat_template: llama3
  // renders it anyway, without the system turn (system_block is false then).
  bool known = true;

  static Llama3Style OfTemplate(absl::string_view jinja);
};

}  // namespace tokenizer_internal

struct Tokenizer::Impl {
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> id_to_token;
  std::unordered_map<std::string, int32_t> merge_rank;  // "left right" → rank
  bool ignore_merges = false;
  bool nfc = false;
  std::vector<tokenizer_internal::PreTokenizerStep> pre;
  std::vector<tokenizer_internal::AddedToken>
      added;  // Longest content first, for leftmost-longest matching.
  std::unordered_map<int32_t, size_t> added_index;
  std::vector<int32_t> prefix_ids, suffix_ids;  // TemplateProcessing around a single sequence.
  ChatTemplate chat = ChatTemplate::kNone;
  tokenizer_internal::ChatMlStyle chatml;
  tokenizer_internal::Llama3Style llama3;
  std::string default_system;
  std::string bos_token;
  // Why a template that was found is not rendered (chat is kNone then); "" when none was found.
  std::string refused_template;

  // The BPE model's vocab, merges and flags; added tokens. Each raises *max_id to its largest id.
  absl::Status ParseBpeModel(const nlohmann::json& model, absl::string_view source,
                             int32_t* max_id);
  absl::Status ParseAddedTokens(const nlohmann::json& root, absl::string_view source,
                                int32_t* max_id);
  absl::Status ParseNormalizer(const nlohmann::json& normalizer, absl::string_view source);
  absl::Status ParsePreTokenizer(const nlohmann::json& step, absl::string_view source);
  absl::Status ParsePostProcessor(const nlohmann::json& processor, absl::string_view source);
  void Bpe(const std::string& piece, std::vector<int32_t>* ids) const;
  void EncodeSegment(absl::string_view text, std::vector<int32_t>* ids) const;
};

}  // namespace rlhfd::model
