// Byte-level BPE tokenizer; see tokenizer.h.
#include "worker/model/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"
#include "common/util/text.h"
#include "worker/model/json_fields.h"

namespace rlhfd::model {
namespace {

// GPT-2's pattern, used by ByteLevel pre-tokenizers with use_regex.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Decodes one UTF-8 sequence at `i`. Returns its length and sets `cp`, or returns the length of
// the maximal invalid subpart (>= 1) with cp = UINT32_MAX (Unicode's substitution practice,
// which Rust's from_utf8_lossy follows).
size_t DecodeUtf8(absl::string_view s, size_t i, uint32_t* cp) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = byte(i);
  *cp = UINT32_MAX;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t length;
  uint8_t low = 0x80, high = 0xBF;
  uint32_t value;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2, value = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3, value = b0 & 0x0F;
    if (b0 == 0xE0) low = 0xA0;
    if (b0 == 0xED) high = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4, value = b0 & 0x07;
    if (b0 == 0xF0) low = 0x90;
    if (b0 == 0xF4) high = 0x8F;
  } else {
    return 1;
  }
  for (size_t k = 1; k < length; ++k) {
    if (i + k >= s.size()) return k;
    const uint8_t b = byte(i + k);
    if (b < (k == 1 ? low : 0x80) || b > (k == 1 ? high : 0xBF)) return k;
    value = (value << 6) | (b & 0x3F);
  }
  *cp = value;
  return length;
}

bool IsValidUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    i += DecodeUtf8(s, i, &cp);
    if (cp == UINT32_MAX) return false;
  }
  return true;
}

std::string LossyUtf8(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    const size_t n = DecodeUtf8(s, i, &cp);
    if (cp == UINT32_MAX) {
      out += kReplacement;
    } else {
      out.append(s.data() + i, n);
    }
    i += n;
  }
  return out;
}

// GPT-2's reversible byte → printable-character map, and its inverse.
struct ByteMap {
  std::string to_unicode[256];
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteMap() {
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      const uint32_t cp = printable ? b : next++;
      AppendUtf8(cp, &to_unicode[b]);
      to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteMap& Bytes() {
  static const ByteMap map;
  return map;
}

struct RegexDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
using Regex = std::shared_ptr<pcre2_code>;

absl::StatusOr<Regex> CompileRegex(const std::string& pattern, absl::string_view source) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat(source,
                                                   ": pre-tokenizer pattern does not compile at ",
                                                   offset, ": ", reinterpret_cast<char*>(message)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // Falls back to the interpreter if unavailable.
  return Regex(code, RegexDeleter());
}

// Splits `text` into matches and the gaps between them ("Isolated" behaviour), in order.
void SplitIsolated(const Regex& regex, absl::string_view text, std::vector<std::string>* out) {
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(regex.get(), nullptr);
  size_t start = 0, gap = 0;
  while (start <= text.size()) {
    const int rc = pcre2_match(regex.get(), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                               start, PCRE2_NO_UTF_CHECK, match, nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
    const size_t begin = ovector[0], end = ovector[1];
    if (begin > gap) out->emplace_back(text.substr(gap, begin - gap));
    if (end > begin) out->emplace_back(text.substr(begin, end - begin));
    gap = end;
    if (end == begin) {
      // Empty match: step over one whole character.
      uint32_t cp;
      if (end >= text.size()) break;
      start = end + DecodeUtf8(text, end, &cp);
    } else {
      start = end;
    }
  }
  if (gap < text.size()) out->emplace_back(text.substr(gap));
  pcre2_match_data_free(match);
}

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

// Unicode White_Space (what tokenizers' lstrip / rstrip test, Rust's char::is_whitespace).
bool IsWhitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// The code point starting at byte `i` of valid UTF-8 `text`, and its length.
std::pair<uint32_t, size_t> CodePointAt(absl::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t lead = byte(i);
  if (lead < 0x80) return {lead, 1};
  const size_t length = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
  uint32_t c = lead & (0x7F >> length);
  for (size_t k = 1; k < length; ++k) c = (c << 6) | (byte(i + k) & 0x3F);
  return {c, length};
}

// Where the whitespace run ending at `end` starts, not before `floor`.
size_t WhitespaceRunStart(absl::string_view text, size_t floor, size_t end) {
  while (end > floor) {
    size_t start = end - 1;
    while (start > floor && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
    if (!IsWhitespace(CodePointAt(text, start).first)) break;
    end = start;
  }
  return end;
}

// Where the whitespace run starting at `begin` ends.
size_t WhitespaceRunEnd(absl::string_view text, size_t begin) {
  while (begin < text.size()) {
    const auto [c, length] = CodePointAt(text, begin);
    if (!IsWhitespace(c)) break;
    begin += length;
  }
  return begin;
}

std::string TokenContent(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return "";
}

}  // namespace

struct Tokenizer::Impl {
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> id_to_token;
  std::unordered_map<std::string, int32_t> merge_rank;  // "left right" → rank
  bool ignore_merges = false;
  bool nfc = false;
  std::vector<PreTokenizerStep> pre;
  std::vector<AddedToken> added;  // Longest content first, for leftmost-longest matching.
  std::unordered_map<int32_t, size_t> added_index;
  std::vector<int32_t> prefix_ids, suffix_ids;  // TemplateProcessing around a single sequence.
  ChatTemplate chat = ChatTemplate::kNone;
  std::string default_system;
  std::string bos_token;

  absl::Status ParseNormalizer(const nlohmann::json& normalizer, absl::string_view source);
  absl::Status ParsePreTokenizer(const nlohmann::json& step, absl::string_view source);
  absl::Status ParsePostProcessor(const nlohmann::json& processor, absl::string_view source);
  void Bpe(const std::string& piece, std::vector<int32_t>* ids) const;
  void EncodeSegment(absl::string_view text, std::vector<int32_t>* ids) const;
};

absl::Status Tokenizer::Impl::ParseNormalizer(const nlohmann::json& normalizer,
                                              absl::string_view source) {
  if (normalizer.is_null()) return absl::OkStatus();
  std::string type;
  RETURN_IF_ERROR(JsonFields(normalizer, source).String("type", "", &type));
  if (type == "NFC") {
    nfc = true;
  } else if (type == "Sequence" && normalizer.contains("normalizers") &&
             normalizer["normalizers"].is_array()) {
    for (const auto& inner : normalizer["normalizers"])
      RETURN_IF_ERROR(ParseNormalizer(inner, source));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": normalizer '", SanitizeForDisplay(type, 40),
                     "' is not supported (NFC, Sequence)"));
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::ParsePreTokenizer(const nlohmann::json& step,
                                                absl::string_view source) {
  if (step.is_null()) return absl::OkStatus();
  const JsonFields fields(step, source);
  std::string type;
  RETURN_IF_ERROR(fields.String("type", "", &type));
  if (type == "Sequence" && step.contains("pretokenizers") && step["pretokenizers"].is_array()) {
    for (const auto& inner : step["pretokenizers"])
      RETURN_IF_ERROR(ParsePreTokenizer(inner, source));
    return absl::OkStatus();
  }
  if (type == "Split") {
    std::string behavior;
    bool invert = false;
    RETURN_IF_ERROR(fields.String("behavior", "", &behavior));
    RETURN_IF_ERROR(fields.Bool("invert", false, &invert));
    if (!step.contains("pattern") || !step["pattern"].is_object() ||
        !step["pattern"].contains("Regex") || !step["pattern"]["Regex"].is_string() ||
        behavior != "Isolated" || invert) {
      return absl::InvalidArgumentError(
          absl::StrCat(source,
                       ": only Split pre-tokenizers with a Regex pattern, behavior Isolated and no "
                       "invert are supported"));
    }
    ASSIGN_OR_RETURN(Regex regex,
                     CompileRegex(step["pattern"]["Regex"].get<std::string>(), source));
    pre.push_back({PreTokenizerStep::kSplit, regex, false});
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    PreTokenizerStep byte_level{PreTokenizerStep::kByteLevel, nullptr, false};
    bool use_regex = true;
    RETURN_IF_ERROR(fields.Bool("add_prefix_space", false, &byte_level.add_prefix_space));
    RETURN_IF_ERROR(fields.Bool("use_regex", true, &use_regex));
    if (use_regex) {
      ASSIGN_OR_RETURN(byte_level.regex, CompileRegex(kGpt2Pattern, source));
    }
    pre.push_back(byte_level);
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      source, ": pre-tokenizer '", SanitizeForDisplay(type, 40),
      "' is not supported (Split, ByteLevel, Sequence)"));
}

absl::Status Tokenizer::Impl::ParsePostProcessor(const nlohmann::json& processor,
                                                 absl::string_view source) {
  if (processor.is_null()) return absl::OkStatus();
  std::string type;
  RETURN_IF_ERROR(JsonFields(processor, source).String("type", "", &type));
  if (type == "ByteLevel") return absl::OkStatus();  // Offsets only; ids unchanged.
  if (type == "Sequence" && processor.contains("processors") &&
      processor["processors"].is_array()) {
    for (const auto& inner : processor["processors"]) {
      RETURN_IF_ERROR(ParsePostProcessor(inner, source));
    }
    return absl::OkStatus();
  }
  if (type == "TemplateProcessing" && processor.contains("single") &&
      processor["single"].is_array()) {
    bool seen_sequence = false;
    for (const auto& piece : processor["single"]) {
      if (!piece.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": post-processor pieces must be objects"));
      }
      if (piece.contains("Sequence")) {
        seen_sequence = true;
      } else if (piece.contains("SpecialToken") && piece["SpecialToken"].is_object() &&
                 piece["SpecialToken"].contains("id") &&
                 piece["SpecialToken"]["id"].is_string()) {
        const std::string name = piece["SpecialToken"]["id"].get<std::string>();
        auto it = vocab.find(name);
        if (it == vocab.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat(source, ": post-processor names unknown token '",
                           SanitizeForDisplay(name, 60), "'"));
        }
        (seen_sequence ? suffix_ids : prefix_ids).push_back(it->second);
      }
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      source, ": post-processor '", SanitizeForDisplay(type, 40),
      "' is not supported (ByteLevel, TemplateProcessing)"));
}

void Tokenizer::Impl::Bpe(const std::string& piece, std::vector<int32_t>* ids) const {
  std::string mapped;
  for (unsigned char byte : piece) mapped += Bytes().to_unicode[byte];
  if (ignore_merges) {
    if (auto it = vocab.find(mapped); it != vocab.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  // Symbols: one mapped character (one byte of the piece) each, merged by rank.
  std::vector<std::string> symbols;
  for (size_t i = 0; i < mapped.size();) {
    uint32_t cp;
    const size_t n = DecodeUtf8(mapped, i, &cp);
    symbols.push_back(mapped.substr(i, n));
    i += n;
  }
  while (symbols.size() > 1) {
    int32_t best_rank = INT32_MAX;
    size_t best = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      auto it = merge_rank.find(symbols[i] + " " + symbols[i + 1]);
      if (it != merge_rank.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank == INT32_MAX) break;
    const std::string left = symbols[best], right = symbols[best + 1];
    std::vector<std::string> merged;
    for (size_t i = 0; i < symbols.size(); ++i) {
      if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
        merged.push_back(left + right);
        ++i;
      } else {
        merged.push_back(symbols[i]);
      }
    }
    symbols = std::move(merged);
  }
  for (const std::string& symbol : symbols) {
    auto it = vocab.find(symbol);
    // Every byte has a token in byte-level vocabularies; a missing one is skipped, as HF does
    // without an unk token.
    if (it != vocab.end()) ids->push_back(it->second);
  }
}

void Tokenizer::Impl::EncodeSegment(absl::string_view text, std::vector<int32_t>* ids) const {
  // HF drops empty pieces before pre-tokenizing, so text that is empty (between two added
  // tokens, or once lstrip / rstrip took its whitespace) gets no prefix space.
  if (text.empty()) return;
  std::string normalized(text);
  if (nfc && !normalized.empty()) {
    utf8proc_uint8_t* composed =
        utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(normalized.c_str()));
    if (composed != nullptr) {
      normalized = reinterpret_cast<char*>(composed);
      std::free(composed);
    }
  }
  std::vector<std::string> pieces = {normalized};
  for (const PreTokenizerStep& step : pre) {
    std::vector<std::string> next;
    for (std::string& piece : pieces) {
      if (piece.empty()) continue;
      if (step.kind == PreTokenizerStep::kByteLevel && step.add_prefix_space &&
          !absl::StartsWith(piece, " ")) {
        piece.insert(0, " ");
      }
      if (step.regex) {
        SplitIsolated(step.regex, piece, &next);
      } else {
        next.push_back(std::move(piece));
      }
    }
    pieces = std::move(next);
  }
  for (const std::string& piece : pieces) {
    if (!piece.empty()) Bpe(piece, ids);
  }
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<Tokenizer> Tokenizer::FromJson(absl::string_view json, absl::string_view source) {
  ASSIGN_OR_RETURN(const nlohmann::json root, ParseModelJson(json, source));
  try {
    return FromParsedJson(root, source);
  } catch (const std::exception& error) {
    // Every read is typed; this boundary keeps a file from ever throwing past it.
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": cannot be read (", SanitizeForDisplay(error.what(), 200), ")"));
  }
}

absl::StatusOr<Tokenizer> Tokenizer::FromParsedJson(const nlohmann::json& root,
                                                    absl::string_view source) {
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  auto impl = std::make_unique<Impl>();
  const nlohmann::json& model = root.contains("model") ? root["model"] : nlohmann::json();
  std::string model_type;
  if (model.is_object()) RETURN_IF_ERROR(JsonFields(model, source).String("type", "", &model_type));
  if (!model.is_object() || model_type != "BPE" || !model.contains("vocab") ||
      !model["vocab"].is_object() || !model.contains("merges") || !model["merges"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": model must be a BPE model with vocab and merges"));
  }
  int32_t max_id = -1;
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > (1 << 24)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": vocab id of '", SanitizeForDisplay(token, 60), "' is invalid"));
    }
    impl->vocab[token] = id.get<int32_t>();
    max_id = std::max(max_id, id.get<int32_t>());
  }
  int32_t rank = 0;
  for (const auto& merge : model["merges"]) {
    std::string key;
    if (merge.is_string()) {
      key = merge.get<std::string>();
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      key = merge[0].get<std::string>() + " " + merge[1].get<std::string>();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(source, ": merge ", rank, " is malformed"));
    }
    impl->merge_rank.emplace(std::move(key), rank++);
  }
  bool byte_fallback = false;
  RETURN_IF_ERROR(JsonFields(model, source).Bool("ignore_merges", false, &impl->ignore_merges));
  RETURN_IF_ERROR(JsonFields(model, source).Bool("byte_fallback", false, &byte_fallback));
  if (byte_fallback) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": byte_fallback BPE (SentencePiece-style) is not supported"));
  }
  if (root.contains("added_tokens")) {
    if (!root["added_tokens"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": added_tokens must be a list"));
    }
    for (const auto& token : root["added_tokens"]) {
      if (!token.is_object() || !token.contains("id") || !token["id"].is_number_integer() ||
          !token.contains("content") || !token["content"].is_string() ||
          token["content"].get<std::string>().empty() || token["id"].get<int64_t>() < 0 ||
          token["id"].get<int64_t>() > (1 << 24)) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": malformed added token"));
      }
      AddedToken added{token["id"].get<int32_t>(), token["content"].get<std::string>(), false};
      const JsonFields fields(token, source);
      RETURN_IF_ERROR(fields.Bool("special", false, &added.special));
      RETURN_IF_ERROR(fields.Bool("lstrip", false, &added.lstrip));
      RETURN_IF_ERROR(fields.Bool("rstrip", false, &added.rstrip));
      impl->vocab[added.content] = added.id;
      max_id = std::max(max_id, added.id);
      impl->added.push_back(added);
    }
  }
  std::stable_sort(
      impl->added.begin(), impl->added.end(),
      [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
  for (size_t i = 0; i < impl->added.size(); ++i) impl->added_index[impl->added[i].id] = i;
  impl->id_to_token.assign(max_id + 1, "");
  for (const auto& [token, id] : impl->vocab) impl->id_to_token[id] = token;

  const auto section = [&root](const char* key) {
    return root.contains(key) ? root[key] : nlohmann::json();
  };
  RETURN_IF_ERROR(impl->ParseNormalizer(section("normalizer"), source));
  RETURN_IF_ERROR(impl->ParsePreTokenizer(section("pre_tokenizer"), source));
  RETURN_IF_ERROR(impl->ParsePostProcessor(section("post_processor"), source));
  if (const nlohmann::json decoder = section("decoder"); !decoder.is_null()) {
    std::string type;
    RETURN_IF_ERROR(JsonFields(decoder, source).String("type", "", &type));
    if (type != "ByteLevel") {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": decoder '", SanitizeForDisplay(type, 40), "' is not supported (ByteLevel)"));
    }
  }
  return Tokenizer(std::move(impl));
}

absl::StatusOr<TokenizerConfig> ParseTokenizerConfig(absl::string_view text,
                                                     absl::string_view source) {
  ASSIGN_OR_RETURN(const nlohmann::json config, ParseModelJson(text, source));
  if (!config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  TokenizerConfig out;
  // A list of named templates (some repositories) is read as no template: pick one with
  // model.chat_template.
  if (config.contains("chat_template") && config["chat_template"].is_string()) {
    out.chat_template = config["chat_template"].get<std::string>();
  }
  if (config.contains("bos_token")) out.bos_token = TokenContent(config["bos_token"]);
  return out;
}

absl::StatusOr<Tokenizer> Tokenizer::Load(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 256 << 20));
  ASSIGN_OR_RETURN(Tokenizer tokenizer, FromJson(text, path));
  const std::string config_path = dir + "/tokenizer_config.json";
  TokenizerConfig config;
  auto config_text = ReadFileToString(config_path, 64 << 20);
  if (config_text.ok()) {
    ASSIGN_OR_RETURN(config, ParseTokenizerConfig(*config_text, config_path));
  } else if (!absl::IsNotFound(config_text.status())) {
    return config_text.status();
  }
  std::string jinja = config.chat_template;
  tokenizer.impl_->bos_token = config.bos_token;
  if (jinja.empty()) {
    if (auto file = ReadFileToString(dir + "/chat_template.jinja", 1 << 20); file.ok())
      jinja = *file;
  }
  ASSIGN_OR_RETURN(ChatTemplate chat, ChooseChatTemplate("auto", jinja));
  // Qwen2.5's template adds this system prompt when the conversation has none.
  constexpr char kQwenSystem[] =
      "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
  tokenizer.set_chat_template(chat, absl::StrContains(jinja, kQwenSystem) ? kQwenSystem : "");
  return tokenizer;
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text,
                                                       bool add_special_tokens) const {
  if (!IsValidUtf8(text)) return absl::InvalidArgumentError("text is not valid UTF-8");
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = impl_->prefix_ids;
  // Added tokens are matched in the raw text first (leftmost, longest), taking the whitespace
  // beside them where they lstrip / rstrip; the text between them is normalised, pre-tokenised
  // and merged.
  size_t segment = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* found = nullptr;
    for (const AddedToken& token : impl_->added) {
      if (text.substr(i, token.content.size()) == token.content) {
        found = &token;
        break;
      }
    }
    if (found == nullptr) {
      ++i;
      continue;
    }
    const size_t before = found->lstrip ? WhitespaceRunStart(text, segment, i) : i;
    impl_->EncodeSegment(text.substr(segment, before - segment), &ids);
    ids.push_back(found->id);
    i += found->content.size();
    if (found->rstrip) i = WhitespaceRunEnd(text, i);
    segment = i;
  }
  impl_->EncodeSegment(text.substr(segment), &ids);
  if (add_special_tokens) ids.insert(ids.end(), impl_->suffix_ids.begin(), impl_->suffix_ids.end());
  return ids;
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const {
  std::string out, bytes;
  auto flush = [&] {
    out += LossyUtf8(bytes);
    bytes.clear();
  };
  for (int32_t id : ids) {
    if (id < 0 || id >= static_cast<int32_t>(impl_->id_to_token.size())) continue;
    if (auto added = impl_->added_index.find(id); added != impl_->added_index.end()) {
      const AddedToken& token = impl_->added[added->second];
      if (skip_special_tokens && token.special) continue;
      flush();
      out += token.content;
      continue;
    }
    const std::string& token = impl_->id_to_token[id];
    for (size_t i = 0; i < token.size();) {
      uint32_t cp;
      const size_t n = DecodeUtf8(token, i, &cp);
      auto byte = Bytes().to_byte.find(cp);
      if (byte != Bytes().to_byte.end()) bytes.push_back(static_cast<char>(byte->second));
      i += n;
    }
  }
  flush();
  return out;
}

int32_t Tokenizer::TokenToId(absl::string_view token) const {
  auto it = impl_->vocab.find(std::string(token));
  return it == impl_->vocab.end() ? -1 : it->second;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_to_token.size()); }

ChatTemplate Tokenizer::chat_template() const { return impl_->chat; }

void Tokenizer::set_chat_template(ChatTemplate chat_template, std::string default_system) {
  impl_->chat = chat_template;
  impl_->default_system = std::move(default_system);
}

absl::StatusOr<std::string> Tokenizer::ApplyChatTemplate(const std::vector<ChatMessage>& messages,
                                                         bool add_generation_prompt) const {
  std::string out;
  switch (impl_->chat) {
    case ChatTemplate::kChatMl:
      if (!impl_->default_system.empty() && (messages.empty() || messages[0].role != "system")) {
        absl::StrAppend(&out, "<|im_start|>system\n", impl_->default_system, "<|im_end|>\n");
      }
      for (const ChatMessage& message : messages) {
        absl::StrAppend(&out, "<|im_start|>", message.role, "\n", message.content, "<|im_end|>\n");
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    case ChatTemplate::kLlama3:
      out = impl_->bos_token;
      for (const ChatMessage& message : messages) {
        absl::StrAppend(&out, "<|start_header_id|>", message.role, "<|end_header_id|>\n\n",
                        absl::StripAsciiWhitespace(message.content), "<|eot_id|>");
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    case ChatTemplate::kNone:
      break;
  }
  return absl::InvalidArgumentError(
      "this tokenizer has no chat template; set model.chat_template (chatml, llama3) or give "
      "plain-text prompts");
}

absl::Status CheckTokenizerFitsModel(const Tokenizer& tokenizer, int64_t model_vocab_size,
                                     absl::string_view dir) {
  if (tokenizer.vocab_size() <= model_vocab_size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      dir, ": the tokenizer has ids up to ", tokenizer.vocab_size() - 1,
      " but config.json's vocab_size is ", model_vocab_size,
      "; the model has no embedding for the rest. Use the tokenizer the model was trained with, "
      "or resize the embeddings"));
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
