// Tokenizer against Hugging Face tokenizers: ids on a corpus with Unicode, emoji, CJK, digits,
// whitespace runs, newlines and special tokens; decode(encode(x)) round trips; chat templates;
// malformed tokenizer.json files are refused with a reason.
#include "worker/model/tokenizer.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"
#include "tests/support/subprocess.h"

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

// The expected texts are transformers 5.17's apply_chat_template with Qwen3's template
// (tests/fixtures/qwen3_chat_template.jinja) on the same messages.
TEST_CASE("Qwen3's template: think blocks after the last query, arguments as given, the switch",
          "[tokenizer]") {
  auto tokenizer = Tokenizer::Load(kFixtures + "/tokenizers/qwen3-thinking");
  REQUIRE(tokenizer.ok());
  CHECK(tokenizer->hermes_tool_format());
  const ChatToolCall run{"python", R"j({"code": "print(6*7)"})j", R"j({"code":"print(6*7)"})j"};
  // Turns before the last query lose their reasoning (a <think> block in the content, or
  // reasoning_content); the last answer gets a block, empty without reasoning.
  const std::vector<ChatMessage> history = {{"system", "Be brief."},
                                            {"user", "6*7?"},
                                            {"assistant", "<think>\nmultiply\n</think>\n\n", {run}},
                                            {"tool", "42"},
                                            {"assistant", "It is 42.", {}, "The tool said 42."},
                                            {"user", "And 2*3?"},
                                            {"assistant", "6"}};
  const std::string head =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n6*7?<|im_end|>\n"
      "<|im_start|>assistant\n<tool_call>\n{\"name\": \"python\", \"arguments\": "
      "{\"code\":\"print(6*7)\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n42\n"
      "</tool_response><|im_end|>\n<|im_start|>assistant\nIt is 42.<|im_end|>\n"
      "<|im_start|>user\nAnd 2*3?<|im_end|>\n<|im_start|>assistant\n";
  CHECK(*tokenizer->ApplyChatTemplate(history, false) ==
        head + "<think>\n\n</think>\n\n6<|im_end|>\n");
  const std::vector<ChatMessage> asked(history.begin(), history.end() - 1);
  CHECK(*tokenizer->ApplyChatTemplate(asked, true) == head);
  CHECK(*tokenizer->ApplyChatTemplate(asked, true, {}, {.enable_thinking = false}) ==
        head + "<think>\n\n</think>\n\n");
  CHECK(*tokenizer->ApplyChatTemplate(asked, true, {}, {.enable_thinking = true}) == head);
  // After the last query, a turn with reasoning keeps its block though it is not the last; the
  // content's block is what follows its first </think> (after its last <think>) up to there.
  const std::vector<ChatMessage> steps = {
      {"user", "6*7?"},
      {"assistant", "\nlet me run it", {{"python", R"j({"code": "print(6*7)"})j"}}, "\nmultiply\n"},
      {"tool", "42"},
      {"assistant", "<think>a<think>b\n</think>x</think>\n\nIt is 42."}};
  CHECK(*tokenizer->ApplyChatTemplate(steps, false) ==
        "<|im_start|>user\n6*7?<|im_end|>\n<|im_start|>assistant\n<think>\nmultiply\n</think>\n\n"
        "let me run it\n<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": "
        "\"print(6*7)\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n42\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nb\n</think>\n\nIt is "
        "42.<|im_end|>\n");
  // A turn as generated (a rollout's, an SFT target's): its block, empty without reasoning.
  CHECK(*tokenizer->ApplyChatTemplateAssistantTurn(steps[1]) ==
        "<think>\nmultiply\n</think>\n\nlet me run it\n<tool_call>\n{\"name\": \"python\", "
        "\"arguments\": {\"code\": \"print(6*7)\"}}\n</tool_call><|im_end|>");
  CHECK(*tokenizer->ApplyChatTemplateAssistantTurn({"assistant", "6"}) ==
        "<think>\n\n</think>\n\n6<|im_end|>");
  CHECK(*tokenizer->ApplyChatTemplateAssistantTurn({"assistant", "6"}, AnswerText::kWithoutQuery) ==
        "6<|im_end|>");
  // Thinking off: the generation prompt holds the empty block, so the turn is its content, and
  // reasoning has no place.
  CHECK(*tokenizer->ApplyChatTemplateAssistantTurn({"assistant", "\n6"}, AnswerText::kAfterQuery,
                                                   {.enable_thinking = false}) == "6<|im_end|>");
  const absl::StatusOr<std::string> reasoning = tokenizer->ApplyChatTemplateAssistantTurn(
      steps[3], AnswerText::kAfterQuery, {.enable_thinking = false});
  REQUIRE_FALSE(reasoning.ok());
  CHECK(absl::StrContains(reasoning.status().message(), "while enable_thinking is false"));
  CHECK(
      *tokenizer->ApplyChatTemplateContinuation({{"user", "more?"}}, {.enable_thinking = false}) ==
      "\n<|im_start|>user\nmore?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  CHECK(*tokenizer->ApplyChatTemplateToolResponses({"42"}, {.enable_thinking = false}) ==
        "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  CHECK(IsUserQuery({"user", "hi"}));
  CHECK_FALSE(IsUserQuery({"user", "<tool_response>\n42\n</tool_response>"}));
  CHECK_FALSE(IsUserQuery({"tool", "42"}));

  // Qwen2.5's template has none of it: reasoning stays in the content, the switch is not read,
  // arguments are printed as the object they hold.
  auto qwen25 = Tokenizer::Load(kFixtures + "/models/tiny-qwen2-tools");
  REQUIRE(qwen25.ok());
  CHECK(*qwen25->ApplyChatTemplateAssistantTurn({"assistant", "<think>x</think>6", {run}},
                                                AnswerText::kAfterQuery,
                                                {.enable_thinking = false}) ==
        "<think>x</think>6\n<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": "
        "\"print(6*7)\"}}\n</tool_call><|im_end|>");
  CHECK(absl::EndsWith(
      *qwen25->ApplyChatTemplate({{"user", "hi"}}, true, {}, {.enable_thinking = false}),
      "<|im_start|>assistant\n"));
}

// The expected texts are transformers 5.17's apply_chat_template with Qwen3-Thinking-2507's
// template (tests/fixtures/qwen3_thinking_2507_chat_template.jinja) on the same messages.
TEST_CASE("Qwen3-Thinking-2507's template: the generation prompt opens the think block",
          "[tokenizer]") {
  auto tokenizer = Tokenizer::Load(kFixtures + "/tokenizers/qwen3-thinking-2507");
  REQUIRE(tokenizer.ok());
  REQUIRE(tokenizer->chat_template() == ChatTemplate::kChatMl);
  const std::vector<ChatMessage> asked = {
      {"system", "Be brief."},
      {"user", "6*7?"},
      {"assistant",
       "<think>\nmultiply\n</think>\n\n",
       {{"python", R"j({"code": "print(6*7)"})j", R"j({"code":"print(6*7)"})j"}}},
      {"tool", "42"},
      {"assistant", "It is 42.", {}, "The tool said 42."},
      {"user", "And 2*3?"}};
  const std::string head =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n6*7?<|im_end|>\n"
      "<|im_start|>assistant\n<tool_call>\n{\"name\": \"python\", \"arguments\": "
      "{\"code\":\"print(6*7)\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n42\n"
      "</tool_response><|im_end|>\n<|im_start|>assistant\nIt is 42.<|im_end|>\n"
      "<|im_start|>user\nAnd 2*3?<|im_end|>\n<|im_start|>assistant\n";
  std::vector<ChatMessage> answered = asked;
  answered.push_back({"assistant", "6"});
  CHECK(*tokenizer->ApplyChatTemplate(answered, false) ==
        head + "<think>\n\n</think>\n\n6<|im_end|>\n");
  // The template has no switch: enable_thinking false changes nothing, as in transformers.
  for (const std::optional<bool> thinking : {std::optional<bool>(), std::optional<bool>(false)}) {
    CHECK(*tokenizer->ApplyChatTemplate(asked, true, {}, {.enable_thinking = thinking}) ==
          head + "<think>\n");
  }
  // The turn as generated: what the whole rendering adds after the generation prompt.
  CHECK(*tokenizer->ApplyChatTemplateAssistantTurn({"assistant", "6"}) ==
        "\n</think>\n\n6<|im_end|>");
  CHECK(*tokenizer->ApplyChatTemplateAssistantTurn(
            {"assistant", "\n6", {}, "\nthink\n"}, AnswerText::kAfterQuery,
            {.enable_thinking = false}) == "think\n</think>\n\n6<|im_end|>");
  // With no user query before it the template renders the answer without a block, though its
  // generation prompt opened one; the turn is laid out as a rollout generates it, inside.
  CHECK(*tokenizer->ApplyChatTemplate({{"system", "S"}}, true) ==
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>assistant\n<think>\n");
  CHECK(*tokenizer->ApplyChatTemplateAssistantTurn({"assistant", "6"}, AnswerText::kWithoutQuery) ==
        "\n</think>\n\n6<|im_end|>");
  // A single-turn response (verl's SFTDataset) stays as written after the opening.
  CHECK(*tokenizer->ApplyChatTemplateAssistantTurn({"assistant", "<think>\nx\n</think>\n\n6"},
                                                   AnswerText::kAsWritten) ==
        "<think>\nx\n</think>\n\n6<|im_end|>");
  // Llama 3's template strips an answer's whitespace; a response as written keeps it.
  auto llama = Tokenizer::Load(kFixtures + "/tokenizers/llama3-style");
  REQUIRE(llama.ok());
  REQUIRE(llama->chat_template() == ChatTemplate::kLlama3);
  CHECK(*llama->ApplyChatTemplateAssistantTurn({"assistant", " 6\n"}) == "6<|eot_id|>");
  CHECK(*llama->ApplyChatTemplateAssistantTurn({"assistant", " 6\n"}, AnswerText::kAsWritten) ==
        " 6\n<|eot_id|>");
  // The agent loop's tool turn and a conversation going on end in the opening too.
  CHECK(*tokenizer->ApplyChatTemplateToolResponses({"42"}) ==
        "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n");
  CHECK(*tokenizer->ApplyChatTemplateContinuation({{"user", "more?"}}) ==
        "\n<|im_start|>user\nmore?<|im_end|>\n<|im_start|>assistant\n<think>\n");
}

namespace {

// A tokenizer folder holding a fixture's tokenizer (qwen3-thinking's unless named) with `jinja` as
// its template.
absl::StatusOr<Tokenizer> WithTemplate(const testing::TempDir& dir, const std::string& jinja,
                                       const std::string& fixture = "qwen3-thinking") {
  const std::string source = kFixtures + "/tokenizers/" + fixture;
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    absl::StatusOr<std::string> text = ReadFileToString(source + "/" + file);
    if (!text.ok()) return text.status();
    RETURN_IF_ERROR(WriteFileAtomically(dir.path() + "/" + file, *text));
  }
  RETURN_IF_ERROR(WriteFileAtomically(dir.path() + "/chat_template.jinja", jinja));
  return Tokenizer::Load(dir.path());
}

// Qwen3's template with `from` replaced by `to`.
std::string Qwen3TemplateWith(const std::string& from, const std::string& to) {
  absl::StatusOr<std::string> jinja = ReadFileToString(kFixtures + "/qwen3_chat_template.jinja");
  REQUIRE(jinja.ok());
  const size_t at = jinja->rfind(from);
  REQUIRE(at != std::string::npos);
  return jinja->replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("a chat template of another family is refused as such, not as none",
          "[tokenizer][errors]") {
  // DeepSeek-R1's layout, which is neither ChatML nor Llama 3.
  testing::TempDir dir;
  absl::StatusOr<Tokenizer> tokenizer = WithTemplate(
      dir, R"({% for message in messages %}{% if message['role'] == 'user' %}{{'<｜User｜>' + )"
           R"(message['content']}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ )"
           R"('<｜Assistant｜><think>\n' }}{% endif %})");
  REQUIRE(tokenizer.ok());
  CHECK(tokenizer->chat_template() == ChatTemplate::kNone);
  CHECK(absl::StrContains(tokenizer->ApplyChatTemplate({{"user", "hi"}}, true).status().message(),
                          "this model's chat template is of a family rlhfd does not render"));
}

TEST_CASE("a generation prompt opening a think block in a branch of its own is read",
          "[tokenizer]") {
  // Qwen3's answers with a generation prompt that opens the block unless thinking is off.
  const std::string opening_unless_off = Qwen3TemplateWith(
      R"({%- endif %}
{%- endif %})",
      R"({%- else %}
        {{- '<think>\n' }}
    {%- endif %}
{%- endif %})");
  testing::TempDir dir;
  absl::StatusOr<Tokenizer> tokenizer = WithTemplate(dir, opening_unless_off);
  REQUIRE(tokenizer.ok());
  REQUIRE(tokenizer->chat_template() == ChatTemplate::kChatMl);
  CHECK(*tokenizer->ApplyChatTemplate({{"user", "hi"}}, true) ==
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n");
  CHECK(*tokenizer->ApplyChatTemplate({{"user", "hi"}}, true, {}, {.enable_thinking = false}) ==
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  CHECK(*tokenizer->ApplyChatTemplateAssistantTurn({"assistant", "6"}) ==
        "\n</think>\n\n6<|im_end|>");
  CHECK(*tokenizer->ApplyChatTemplateAssistantTurn({"assistant", "6"}, AnswerText::kAfterQuery,
                                                   {.enable_thinking = false}) == "6<|im_end|>");

  // Only a tag testing add_generation_prompt starts the generation prompt's part: Qwen3-Thinking-
  // 2507's template with a comment naming the flag after it still opens the block; Qwen3's that
  // tests a copy of the flag ({% set %}) has no part to read and opens none.
  absl::StatusOr<std::string> thinking_2507 =
      ReadFileToString(kFixtures + "/qwen3_thinking_2507_chat_template.jinja");
  REQUIRE(thinking_2507.ok());
  const std::string qwen3_copied_flag =
      "{%- set generating = add_generation_prompt %}\n" +
      Qwen3TemplateWith("{%- if add_generation_prompt %}", "{%- if generating %}");
  for (const auto& [jinja, prompt_end] :
       {std::pair(*thinking_2507 + "{#- add_generation_prompt is read above #}",
                  "assistant\n<think>\n"),
        std::pair(qwen3_copied_flag, "assistant\n")}) {
    testing::TempDir other;
    absl::StatusOr<Tokenizer> read = WithTemplate(other, jinja);
    REQUIRE(read.ok());
    CHECK(absl::EndsWith(*read->ApplyChatTemplate({{"user", "hi"}}, true), prompt_end));
  }
}

TEST_CASE("a template opening a think block under other rules than Qwen3's is refused, naming it",
          "[tokenizer][errors]") {
  // QwQ's way (every answer but the last loses its reasoning, whatever the queries), and Qwen3's
  // answers written with other whitespace rules (as Qwen3.5's template trims its reasoning).
  const std::string qwq =
      R"({%- for message in messages %}{%- if message.role == "assistant" %}{%- set content = )"
      R"(message.content.split('</think>')[-1].lstrip('\n') %}{{- '<|im_start|>assistant\n' + )"
      R"(content + '<|im_end|>\n' }}{%- else %}{{- '<|im_start|>' + message.role + '\n' + )"
      R"(message.content + '<|im_end|>\n' }}{%- endif %}{%- endfor %}{%- if )"
      R"(add_generation_prompt %}{{- '<|im_start|>assistant\n<think>\n' }}{%- endif %})";
  const std::string trimmed = Qwen3TemplateWith(
      "reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n')",
      "reasoning_content|trim + '\\n</think>\\n\\n' + content");
  const std::string trimmed_opening = trimmed.substr(0, trimmed.rfind("{%- if add_generation")) +
                                      R"({%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n<think>\n' }}
{%- endif %})";
  // OLMo 3 Think's way: the opening without its newline, tested inside the message loop.
  const std::string olmo =
      R"({%- for message in messages %}{{- '<|im_start|>' + message.role + '\n' + )"
      R"(message.content + '<|im_end|>\n' }}{% if loop.last and add_generation_prompt %}{{ )"
      R"('<|im_start|>assistant\n<think>' }}{% endif %}{%- endfor %})";
  for (const std::string& jinja : {qwq, trimmed_opening, olmo}) {
    testing::TempDir dir;
    absl::StatusOr<Tokenizer> tokenizer = WithTemplate(dir, jinja);
    REQUIRE(tokenizer.ok());
    CHECK(tokenizer->chat_template() == ChatTemplate::kNone);
    for (const absl::Status& status :
         {tokenizer->ApplyChatTemplate({{"user", "hi"}}, true).status(),
          tokenizer->ApplyChatTemplateAssistantTurn({"assistant", "6"}).status()}) {
      CHECK(absl::StrContains(status.message(),
                              "opens a <think> block in its generation prompt and lays out"));
    }
    // model.chat_template: chatml renders its turns anyway, without the opening.
    tokenizer->set_chat_template(ChatTemplate::kChatMl);
    CHECK(*tokenizer->ApplyChatTemplate({{"user", "hi"}}, true) ==
          "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    // Without a template at all, the message says so.
    tokenizer->set_chat_template(ChatTemplate::kNone);
    CHECK(absl::StrContains(tokenizer->ApplyChatTemplate({{"user", "hi"}}, true).status().message(),
                            "this tokenizer has no chat template"));
  }
}

// The expected texts are transformers 5.17's apply_chat_template with Llama 3.1-Instruct's
// template (tests/fixtures/llama31_chat_template.jinja) on the same messages.
TEST_CASE("Llama 3.1's template: a system turn of the knowledge cutoff and the date",
          "[tokenizer]") {
  auto tokenizer = Tokenizer::Load(kFixtures + "/tokenizers/llama31-style");
  REQUIRE(tokenizer.ok());
  REQUIRE(tokenizer->chat_template() == ChatTemplate::kLlama3);
  const std::string system_head =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
      "December 2023\nToday Date: 26 Jul 2024\n\n";
  CHECK(*tokenizer->ApplyChatTemplate({{"user", " hi "}}, true) ==
        system_head +
            "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(*tokenizer->ApplyChatTemplate(
            {{"system", "  Be brief.\n"}, {"user", "hi"}, {"assistant", " 6 "}}, false) ==
        system_head +
            "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n6<|eot_id|>");
  // The turn being generated, and a conversation going on, are as Llama 3's.
  CHECK(*tokenizer->ApplyChatTemplateAssistantTurn({"assistant", " 6 "}) == "6<|eot_id|>");
  CHECK(*tokenizer->ApplyChatTemplateContinuation({{"user", "more?"}}) ==
        "<|start_header_id|>user<|end_header_id|>\n\nmore?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Tool output is an ipython turn of its JSON-quoted text there, which is refused, not
  // rendered as Llama 3's "tool" turn.
  for (const absl::Status& status :
       {tokenizer->ApplyChatTemplate({{"user", "q"}, {"assistant", "a"}, {"tool", "42"}}, true)
            .status(),
        tokenizer->ApplyChatTemplateContinuation({{"tool", "42"}}).status()}) {
    CHECK(absl::StrContains(status.message(), "writes tool output as an ipython turn"));
  }

  // Llama 3.2's: today's date (strftime_now), in local time as transformers renders it.
  absl::StatusOr<std::string> llama31 =
      ReadFileToString(kFixtures + "/llama31_chat_template.jinja");
  REQUIRE(llama31.ok());
  const std::string fixed = R"({%- set date_string = "26 Jul 2024" %})";
  const auto with = [](std::string jinja, const std::string& from, const std::string& to) {
    const size_t at = jinja.find(from);
    REQUIRE(at != std::string::npos);
    return jinja.replace(at, from.size(), to);
  };
  testing::TempDir dir;
  const auto load = [&](const std::string& jinja) {
    absl::StatusOr<Tokenizer> loaded = WithTemplate(dir, jinja, "llama3-style");
    REQUIRE(loaded.ok());
    return *std::move(loaded);
  };
  for (const char* format : {R"(strftime_now("%d %b %Y"))", R"(strftime_now('%d %b %Y'))"}) {
    const Tokenizer today =
        load(with(*llama31, fixed,
                  absl::StrCat("{%- if strftime_now is defined %}{%- set date_string = ", format,
                               " %}{%- else %}", fixed, "{%- endif %}")));
    const std::string before = absl::FormatTime("%d %b %Y", absl::Now(), absl::LocalTimeZone());
    const std::string rendered = *today.ApplyChatTemplate({{"user", "hi"}}, true);
    const std::string after = absl::FormatTime("%d %b %Y", absl::Now(), absl::LocalTimeZone());
    CHECK((absl::StrContains(rendered, "\nToday Date: " + before + "\n\n") ||
           absl::StrContains(rendered, "\nToday Date: " + after + "\n\n")));
  }

  // The cutoff line in another layout is refused, and model.chat_template: llama3 renders the
  // turns without it: the system turn only with a system message, a default system message
  // (vLLM's Llama 3.2 tool template), turns not trimmed (Llama 3.2-Vision's).
  const std::string always = R"({{- "<|start_header_id|>system<|end_header_id|>\n\n" }})";
  const std::string end = R"({{- "<|eot_id|>" }})";
  std::string conditional = with(*llama31, always, "{%- if (system_message) %}" + always);
  conditional.insert(conditional.find(end) + end.size(), "{%- endif %}");
  for (const std::string& jinja :
       {conditional,
        with(*llama31, R"(set system_message = "")", R"(set system_message = "Be helpful.")"),
        with(*llama31, "message['content'] | trim + '<|eot_id|>'",
             "message['content'] + '<|eot_id|>'")}) {
    Tokenizer other = load(jinja);
    CHECK(other.chat_template() == ChatTemplate::kNone);
    CHECK(absl::StrContains(other.ApplyChatTemplate({{"user", "hi"}}, true).status().message(),
                            "writes Llama 3.1's system turn (the knowledge cutoff and the date) "
                            "otherwise"));
    other.set_chat_template(ChatTemplate::kLlama3);
    CHECK(*other.ApplyChatTemplate({{"user", "hi"}}, true) ==
          "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n");
  }
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
