// Tokenizer against Hugging Face tokenizers: ids on a corpus with Unicode, emoji, CJK, digits,
// whitespace runs, newlines and special tokens; decode(encode(x)) round trips; chat templates;
// malformed tokenizer.json files are refused with a reason.
#include "worker/model/tokenizer.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "common/util/files.h"

namespace rlhfd::model {
namespace {

const std::string kFixtures = RLHFD_FIXTURES_DIR;

nlohmann::json Golden(const std::string& style) {
  auto text = ReadFileToString(kFixtures + "/tokenizers/" + style + "/golden.json");
  REQUIRE(text.ok());
  return nlohmann::json::parse(*text);
}

std::string ErrorOf(const std::string& json) {
  auto tokenizer = Tokenizer::FromJson(json, "tokenizer.json");
  REQUIRE_FALSE(tokenizer.ok());
  return std::string(tokenizer.status().message());
}

}  // namespace

TEST_CASE("ids, decoding and chat prompts equal Hugging Face's", "[tokenizer]") {
  for (const std::string style : {"qwen2-style", "llama3-style"}) {
    INFO(style);
    auto tokenizer = Tokenizer::Load(kFixtures + "/tokenizers/" + style);
    INFO(tokenizer.status().ToString());
    REQUIRE(tokenizer.ok());
    const nlohmann::json golden = Golden(style);
    int round_trips = 0;
    for (const auto& entry : golden["encode"]) {
      const std::string text = entry["text"];
      INFO("text: " << text);
      auto ids = tokenizer->Encode(text);
      REQUIRE(ids.ok());
      CHECK(*ids == entry["ids"].get<std::vector<int32_t>>());
      CHECK(*tokenizer->Encode(text, /*add_special_tokens=*/true) ==
            entry["ids_with_special"].get<std::vector<int32_t>>());
      const std::string decoded = tokenizer->Decode(*ids);
      CHECK(decoded == entry["decoded"].get<std::string>());
      // Exact round trip wherever normalisation leaves the text as it is.
      if (entry["decoded"] == entry["text"]) {
        CHECK(decoded == text);
        ++round_trips;
      }
    }
    CHECK(round_trips >= 15);
    std::vector<ChatMessage> messages;
    for (const auto& message : golden["chat"]["messages"]) {
      messages.push_back({message["role"], message["content"]});
    }
    auto prompt = tokenizer->ApplyChatTemplate(messages, /*add_generation_prompt=*/true);
    REQUIRE(prompt.ok());
    CHECK(*prompt == golden["chat"]["prompt"].get<std::string>());
  }
}

TEST_CASE("added tokens that lstrip / rstrip take the whitespace beside them, as HF's do",
          "[tokenizer]") {
  auto tokenizer = Tokenizer::Load(kFixtures + "/tokenizers/qwen2-stripping");
  INFO(tokenizer.status().ToString());
  REQUIRE(tokenizer.ok());
  for (const auto& entry : Golden("qwen2-stripping")["encode"]) {
    const std::string text = entry["text"];
    INFO("text: " << text);
    auto ids = tokenizer->Encode(text);
    REQUIRE(ids.ok());
    CHECK(*ids == entry["ids"].get<std::vector<int32_t>>());
    CHECK(tokenizer->Decode(*ids) == entry["decoded"].get<std::string>());
  }
}

TEST_CASE("add_prefix_space drops empty pieces as HF does", "[tokenizer]") {
  auto tokenizer = Tokenizer::Load(kFixtures + "/tokenizers/gpt2-prefix-space");
  INFO(tokenizer.status().ToString());
  REQUIRE(tokenizer.ok());
  for (const auto& entry : Golden("gpt2-prefix-space")["encode"]) {
    const std::string text = entry["text"];
    INFO("text: '" << text << "'");
    auto ids = tokenizer->Encode(text);
    REQUIRE(ids.ok());
    CHECK(*ids == entry["ids"].get<std::vector<int32_t>>());
  }
}

TEST_CASE("special tokens: lookup, skipping on decode", "[tokenizer]") {
  auto tokenizer = Tokenizer::Load(kFixtures + "/tokenizers/qwen2-style");
  REQUIRE(tokenizer.ok());
  const int32_t im_end = tokenizer->TokenToId("<|im_end|>");
  CHECK(im_end == 511);
  CHECK(tokenizer->TokenToId("<|not a token|>") == -1);
  auto ids = tokenizer->Encode("hi<|im_end|>");
  REQUIRE(ids.ok());
  CHECK(ids->back() == im_end);
  CHECK(tokenizer->Decode(*ids, /*skip_special_tokens=*/true) == "hi");
  CHECK(tokenizer->Decode(*ids) == "hi<|im_end|>");
  // Ids outside the vocabulary are dropped rather than crashing.
  CHECK(tokenizer->Decode({-5, 100000}) == "");
}

TEST_CASE("invalid UTF-8 text is refused; invalid byte sequences decode to U+FFFD", "[tokenizer]") {
  auto tokenizer = Tokenizer::Load(kFixtures + "/tokenizers/llama3-style");
  REQUIRE(tokenizer.ok());
  CHECK(absl::IsInvalidArgument(tokenizer->Encode("bad \xC3\x28 byte").status()));
  // The first byte of a two-byte character alone: a byte-level token that is not UTF-8.
  auto ids = tokenizer->Encode("é");
  REQUIRE(ids.ok());
  auto first_byte = tokenizer->Encode("\xC3");
  CHECK_FALSE(first_byte.ok());
  const int32_t lone = tokenizer->TokenToId("Ã");  // Byte 0xC3 in GPT-2's byte map.
  REQUIRE(lone >= 0);
  CHECK(tokenizer->Decode({lone}) == "\xEF\xBF\xBD");
}

TEST_CASE("the tokenizer of a model directory carries its chat template", "[tokenizer]") {
  auto tokenizer = Tokenizer::Load(kFixtures + "/models/tiny-qwen2");
  REQUIRE(tokenizer.ok());
  CHECK(tokenizer->chat_template() == ChatTemplate::kChatMl);
  auto none = ChooseChatTemplate("auto", "{{ messages }}");
  REQUIRE(none.ok());
  CHECK(*none == ChatTemplate::kNone);
  CHECK_FALSE(ChooseChatTemplate("vicuna", "").ok());
}

TEST_CASE("malformed tokenizer.json files are refused with the reason", "[tokenizer][errors]") {
  CHECK_THAT(ErrorOf("{not json"), Catch::Contains("tokenizer.json: not valid JSON"));
  CHECK_THAT(ErrorOf("[1, 2]"), Catch::Contains("tokenizer.json: not a JSON object"));
  CHECK_THAT(ErrorOf(std::string(100, '[') + std::string(100, ']')),
             Catch::Contains("nested deeper than 64 levels"));
  CHECK_THAT(ErrorOf(R"({"model": {"type": "WordPiece", "vocab": {}}})"),
             Catch::Contains("model must be a BPE model"));
  const std::string bpe =
      R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": )";
  CHECK_THAT(ErrorOf("{" + bpe + R"([["a"]]}})"), Catch::Contains("merge 0 is malformed"));
  CHECK_THAT(ErrorOf(R"({"model": {"type": "BPE", "vocab": {"a": -1}, "merges": []}})"),
             Catch::Contains("vocab id of 'a' is invalid"));
  CHECK_THAT(ErrorOf("{" + bpe + R"(["a b"]}, "normalizer": {"type": "Lowercase"}})"),
             Catch::Contains("normalizer 'Lowercase' is not supported"));
  CHECK_THAT(ErrorOf("{" + bpe + R"(["a b"]}, "pre_tokenizer": {"type": "Whitespace"}})"),
             Catch::Contains("pre-tokenizer 'Whitespace' is not supported"));
  CHECK_THAT(
      ErrorOf(
          "{" + bpe +
          R"(["a b"]}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}})"),
      Catch::Contains("pattern does not compile"));
  CHECK_THAT(ErrorOf("{" + bpe + R"(["a b"]}, "added_tokens": [{"id": "x"}]})"),
             Catch::Contains("malformed added token"));
  CHECK_THAT(ErrorOf("{" + bpe + R"(["a b"]}, "decoder": {"type": "WordPiece"}})"),
             Catch::Contains("decoder 'WordPiece' is not supported"));
  auto minimal = Tokenizer::FromJson("{" + bpe + R"(["a b"]}})", "tokenizer.json");
  REQUIRE(minimal.ok());
  CHECK(*minimal->Encode("ab") == std::vector<int32_t>{2});
}

}  // namespace rlhfd::model
