// Byte-level BPE: encoding and decoding; see tokenizer.h (tokenizer_json.cc reads the files,
// chat_template.cc renders chats).
#include "worker/model/tokenizer.h"

#include <utf8proc.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/model/tokenizer_internal.h"

namespace rlhfd::model {

using tokenizer_internal::AddedToken;
using tokenizer_internal::Bytes;
using tokenizer_internal::DecodeUtf8;
using tokenizer_internal::IsValidUtf8;
using tokenizer_internal::LossyUtf8;
using tokenizer_internal::PreTokenizerStep;
using tokenizer_internal::SplitIsolated;
using tokenizer_internal::WhitespaceRunEnd;
using tokenizer_internal::WhitespaceRunStart;

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

absl::Status CheckTokenizerFitsModel(const Tokenizer& tokenizer, int64_t model_vocab_size,
                                     absl::string_view dir) {
  if (tokenizer.vocab_size() <= model_vocab_size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      dir, ": the tokenizer has ids up to ", tokenizer.vocab_size() - 1,
      " but config.json's vocab_size is ", model_vocab_size,
      "; the model has no embedding for the rest. Use the tokenizer the model was trained with, "
      "or resize the embeddings"));
}

}  // namespace rlhfd::model
