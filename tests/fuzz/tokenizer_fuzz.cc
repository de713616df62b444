// libFuzzer target: any bytes as text for the Llama-3-style fixture tokenizer (no normaliser)
// must encode or be refused as non-UTF-8, and decode(encode(x)) must give x back. Inputs that
// start with '{' are also parsed as tokenizer.json, which must never crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/util/files.h"
#include "worker/model/tokenizer.h"

namespace {

const rlhfd::model::Tokenizer& FixtureTokenizer() {
  static const rlhfd::model::Tokenizer* tokenizer = [] {
    auto loaded = rlhfd::model::Tokenizer::Load(RLHFD_FIXTURES_DIR "/tokenizers/llama3-style");
    if (!loaded.ok()) std::abort();
    return new rlhfd::model::Tokenizer(*std::move(loaded));
  }();
  return *tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  if (!text.empty() && text[0] == '{') {
    (void)rlhfd::model::Tokenizer::FromJson(text, "fuzz");
  }
  auto ids = FixtureTokenizer().Encode(text);
  if (ids.ok() && FixtureTokenizer().Decode(*ids) != text) __builtin_trap();
  return 0;
}
