// PromptData's bounds on what rows carry to the workers: one limit per row, checked where the
// file is read and naming the file, line and key; the check that a rank's share of a step fits
// the one stage call it travels in, naming the largest row; and submission's check of the first
// rows against rule auto's sources.
#include "controller/driver/prompt_data.h"

#include <algorithm>
#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "common/util/files.h"
#include "tests/support/subprocess.h"

namespace rlhfd::controller {
namespace {

using testing::TempDir;

std::string Row(const std::string& prompt, const std::string& truth) {
  return absl::StrCat(R"({"prompt": ")", prompt, R"(", "ground_truth": ")", truth, "\"}\n");
}

absl::StatusOr<PromptData> LoadText(const std::string& path, const std::string& text) {
  REQUIRE(WriteFileAtomically(path, text).ok());
  return PromptData::Load({path}, v1::DataSpec());
}

// The message of a load that must be refused as bad input naming `where` (file:line).
std::string RefusalOf(const absl::StatusOr<PromptData>& loaded, const std::string& where) {
  REQUIRE_FALSE(loaded.ok());
  CHECK(loaded.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(loaded.status().message()), Catch::Contains(where));
  return std::string(loaded.status().message());
}

// `row` (written over several lines for reading) as the one line of a conversations file.
absl::StatusOr<PromptData> LoadConversation(const std::string& path, std::string row,
                                            const v1::DataSpec& data = {}) {
  std::replace(row.begin(), row.end(), '\n', ' ');
  REQUIRE(WriteFileAtomically(path, row + "\n").ok());
  return PromptData::Load({path}, data, RowKind::kConversation);
}

TEST_CASE("A row over the limit is refused where it is read, naming file, line and key",
          "[prompt_data]") {
  TempDir dir;
  const std::string path = dir.path() + "/train.jsonl";
  // The probe's case: a 10 MB ground truth, which used to reach gRPC's message limit at a step.
  auto big_truth = LoadText(
      path, Row("What is 2 + 2?", "4") + Row("What is 3 + 4?", std::string(10'000'000, '7')));
  REQUIRE_FALSE(big_truth.ok());
  INFO(big_truth.status().message());
  CHECK(big_truth.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(big_truth.status().message()),
             Catch::Contains(path + ":2") && Catch::Contains("'ground_truth'") &&
                 Catch::Contains(absl::StrCat(kMaxRowBytes)));

  auto big_prompt = LoadText(path, Row(std::string(kMaxRowBytes, 'p'), "4"));
  REQUIRE_FALSE(big_prompt.ok());
  CHECK_THAT(std::string(big_prompt.status().message()),
             Catch::Contains(path + ":1") && Catch::Contains("'prompt'"));

  // Just under the limit loads; what a line holds beside the row (unread columns) is not counted.
  const std::string under =
      absl::StrCat(R"({"prompt": "q", "notes": ")", std::string(2 * kMaxRowBytes, 'x'),
                   R"(", "ground_truth": ")", std::string(kMaxRowBytes - 64, '1'), "\"}\n");
  auto loaded = LoadText(path, under);
  INFO(loaded.status());
  REQUIRE(loaded.ok());
  CHECK(loaded->size() == 1);
}

TEST_CASE("Conversations (trainer.mode sft): the prompt, the target, and what is refused",
          "[prompt_data]") {
  TempDir dir;
  const std::string path = dir.path() + "/chats.jsonl";
  const auto load = [&](const std::string& messages) {
    return LoadConversation(path, R"({"other": 1, "messages": )" + messages + "}");
  };
  auto loaded = load(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
      {"role": "assistant", "content": "call"}, {"role": "tool", "content": "42"},
      {"role": "assistant", "content": "A"}])");
  INFO(loaded.status());
  REQUIRE(loaded.ok());
  const v1::PromptRow& row = loaded->row(0);
  REQUIRE(row.chat_size() == 2);
  CHECK(row.chat(1).content() == "Q");
  REQUIRE(row.target_size() == 3);
  CHECK(row.target(0).role() == "assistant");
  CHECK(row.target(1).role() == "tool");
  CHECK(row.target(2).content() == "A");
  // data.messages_key names the key.
  v1::DataSpec keyed;
  keyed.set_messages_key("other");
  auto wrong_key = PromptData::Load({path}, keyed, RowKind::kConversation);
  REQUIRE_FALSE(wrong_key.ok());
  CHECK_THAT(std::string(wrong_key.status().message()),
             Catch::Contains(path + ":1: no conversation under 'other' (data.messages_key)"));

  const auto refusal = [&](const std::string& messages) {
    return RefusalOf(load(messages), path + ":1");
  };
  CHECK_THAT(refusal(R"([{"role": "user", "content": "Q"}])"),
             Catch::Contains("has no assistant turn"));
  CHECK_THAT(refusal(R"([{"role": "assistant", "content": "A"}])"),
             Catch::Contains("starts with an assistant turn"));
  CHECK_THAT(refusal(R"([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"},
      {"role": "system", "content": "again"}, {"role": "assistant", "content": "B"}])"),
             Catch::Contains("has a 'system' turn (turn 2) after its first assistant turn"));
  CHECK_THAT(refusal(R"([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"},
      {"role": "tool", "content": "42"}])"),
             Catch::Contains("ends in a tool turn"));
  CHECK_THAT(refusal(R"([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"},
      {"role": "assistant", "content": "B"}])"),
             Catch::Contains("has assistant turns 1 and 2 in a row"));
  // Empty or null tool_calls (as Parquet writes a struct's missing field) are no calls.
  loaded = load(R"([{"role": "user", "content": "Q", "tool_calls": null},
      {"role": "assistant", "content": "A", "tool_calls": []}])");
  INFO(loaded.status());
  REQUIRE(loaded.ok());
  CHECK(loaded->row(0).target_size() == 1);
  CHECK(loaded->row(0).target(0).tool_calls_size() == 0);
  CHECK_THAT(refusal(R"("just text")"), Catch::Contains("no conversation under 'messages'"));
  CHECK_THAT(refusal(R"([{"role": "user"}])"),
             Catch::Contains("messages must be a list of {\"role\": ..., \"content\": ...} turns"));
  // Null content only beside tool calls.
  CHECK_THAT(
      refusal(R"([{"role": "user", "content": "Q"}, {"role": "assistant", "content": null}])"),
      Catch::Contains("must be a list of {\"role\""));
}

TEST_CASE("Conversations in verl's multi-turn SFT layout: OpenAI tool_calls, user turns, tools",
          "[prompt_data]") {
  TempDir dir;
  const std::string path = dir.path() + "/chats.jsonl";
  v1::DataSpec with_tools;
  with_tools.set_tools_key("tools");
  const auto load = [&](const std::string& row) { return LoadConversation(path, row); };
  const auto load_with_tools = [&](const std::string& row) {
    return LoadConversation(path, row, with_tools);
  };
  // The calls' arguments keep the file's key order (zeta before alpha), printed as Python's
  // json.dumps prints them; arguments given as JSON text are the object they hold; a call may
  // be {"function": {...}} or the function itself; content may be null beside calls.
  auto loaded = load_with_tools(R"({"messages": [{"role": "user", "content": "Q"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"zeta": [1, 2.5], "alpha": "é\n"}}},
        {"name": "g", "arguments": "{\"b\": true,\"a\":null}"}]},
      {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"},
      {"role": "assistant", "content": "A"}, {"role": "user", "content": "more?"},
      {"role": "assistant", "content": "B"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"zeta": {"type": "array"}, "alpha": {"type": "string"}}}}}]})");
  INFO(loaded.status());
  REQUIRE(loaded.ok());
  const v1::PromptRow& row = loaded->row(0);
  REQUIRE(row.target_size() == 6);
  const v1::ChatTurn& call = row.target(0);
  CHECK(call.content().empty());
  REQUIRE(call.tool_calls_size() == 2);
  CHECK(call.tool_calls(0).name() == "f");
  CHECK(call.tool_calls(0).arguments_json() == "{\"zeta\": [1, 2.5], \"alpha\": \"é\\n\"}");
  CHECK(call.tool_calls(1).name() == "g");
  CHECK(call.tool_calls(1).arguments_json() == "{\"b\": true, \"a\": null}");
  // The text as given too, which Qwen3's template prints; none for an object.
  CHECK_FALSE(call.tool_calls(0).has_arguments_text());
  CHECK(call.tool_calls(1).arguments_text() == "{\"b\": true,\"a\":null}");
  CHECK(row.target(4).role() == "user");
  REQUIRE(row.tools_json_size() == 1);
  CHECK(row.tools_json(0) ==
        "{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": "
        "\"object\", \"properties\": {\"zeta\": {\"type\": \"array\"}, \"alpha\": {\"type\": "
        "\"string\"}}}}}");
  // The tools as JSON text read the same; without data.tools_key they are not read.
  loaded = load_with_tools(R"({"messages": [{"role": "user", "content": "Q"},
      {"role": "assistant", "content": "A"}], "tools": "[{\"type\": \"function\"}]"})");
  INFO(loaded.status());
  REQUIRE(loaded.ok());
  REQUIRE(loaded->row(0).tools_json_size() == 1);
  CHECK(loaded->row(0).tools_json(0) == "{\"type\": \"function\"}");
  CHECK(loaded->row(0).tools_given());
  loaded = load(R"({"messages": [{"role": "user", "content": "Q"},
      {"role": "assistant", "content": "A"}], "tools": [{"type": "function"}]})");
  REQUIRE(loaded.ok());
  CHECK(loaded->row(0).tools_json_size() == 0);
  CHECK_FALSE(loaded->row(0).tools_given());
  // An empty list or null: the row gives its tools, none (verl lists no tool block for it); no
  // key: the row gives none, and multi_turn's are listed.
  for (const std::string& tools :
       {std::string(R"(, "tools": [])"), std::string(R"(, "tools": null)"), std::string()}) {
    INFO(tools);
    loaded = load_with_tools(R"({"messages": [{"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A"}])" +
                             tools + "}");
    REQUIRE(loaded.ok());
    CHECK(loaded->row(0).tools_json_size() == 0);
    CHECK(loaded->row(0).tools_given() == !tools.empty());
  }

  const auto refusal = [&](const std::string& row) {
    return RefusalOf(load_with_tools(row), path + ":1");
  };
  CHECK_THAT(refusal(R"({"messages": [{"role": "user", "content": "Q", "tool_calls": [
      {"function": {"name": "f", "arguments": {}}}]}, {"role": "assistant", "content": "A"}]})"),
             Catch::Contains("(turn 0) tool_calls: only assistant turns call tools"));
  CHECK_THAT(refusal(R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant",
      "content": "", "tool_calls": [{"function": {"arguments": {}}}]},
      {"role": "tool", "content": "1"}, {"role": "assistant", "content": "A"}]})"),
             Catch::Contains("(turn 1) tool_calls[0] must be {\"type\": \"function\""));
  CHECK_THAT(refusal(R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant",
      "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]},
      {"role": "tool", "content": "1"}, {"role": "assistant", "content": "A"}]})"),
             Catch::Contains("tool_calls[0] arguments must be a JSON object (or JSON text "
                             "holding one), not text holding a array"));
  CHECK_THAT(refusal(R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant",
      "content": "", "tool_calls": {"name": "f"}}, {"role": "tool", "content": "1"},
      {"role": "assistant", "content": "A"}]})"),
             Catch::Contains("tool_calls must be a list of calls"));
  CHECK_THAT(refusal(R"({"messages": [{"role": "user", "content": "Q"},
      {"role": "assistant", "content": "A"}], "tools": {"type": "function"}})"),
             Catch::Contains("the tools under 'tools' (data.tools_key) must be a list of tool "
                             "schemas"));
  CHECK_THAT(refusal(R"({"messages": [{"role": "user", "content": "Q"},
      {"role": "assistant", "content": "A"}], "tools": "not json"})"),
             Catch::Contains("(data.tools_key)"));

  // A prompt row's assistant turns carry their calls too (the chat template renders them).
  REQUIRE(WriteFileAtomically(path, R"({"prompt": [{"role": "user", "content": "Q"}, )"
                                    R"({"role": "assistant", "content": "", "tool_calls": )"
                                    R"([{"function": {"name": "f", "arguments": {"x": 1}}}]}, )"
                                    R"({"role": "tool", "content": "1"}]})"
                                    "\n")
              .ok());
  auto prompts = PromptData::Load({path}, v1::DataSpec());
  INFO(prompts.status());
  REQUIRE(prompts.ok());
  REQUIRE(prompts->row(0).chat_size() == 3);
  REQUIRE(prompts->row(0).chat(1).tool_calls_size() == 1);
  CHECK(prompts->row(0).chat(1).tool_calls(0).arguments_json() == "{\"x\": 1}");
  CHECK(prompts->row(0).target_size() == 0);
}

TEST_CASE("Reasoning and the row's own enable_thinking (Qwen3's template reads them)",
          "[prompt_data]") {
  TempDir dir;
  const std::string path = dir.path() + "/chats.jsonl";
  v1::DataSpec keys;
  keys.set_enable_thinking_key("think");
  const auto load = [&](const std::string& row) { return LoadConversation(path, row, keys); };
  // An assistant turn's reasoning_content (null: none, as Parquet writes a missing field); the
  // row's switch under data.enable_thinking_key, null or missing: none.
  auto loaded = load(R"({"messages": [{"role": "user", "content": "Q", "reasoning_content": "x"},
      {"role": "assistant", "content": "A", "reasoning_content": "because"},
      {"role": "user", "content": "more?", "reasoning_content": null},
      {"role": "assistant", "content": "B", "reasoning_content": null}], "think": false})");
  INFO(loaded.status());
  REQUIRE(loaded.ok());
  const v1::PromptRow& row = loaded->row(0);
  CHECK_FALSE(row.chat(0).has_reasoning_content());  // a user turn's is not read
  CHECK(row.target(0).reasoning_content() == "because");
  CHECK_FALSE(row.target(2).has_reasoning_content());
  REQUIRE(row.has_enable_thinking());
  CHECK_FALSE(row.enable_thinking());
  for (const std::string& think : {std::string(R"(, "think": null)"), std::string()}) {
    loaded = load(R"({"messages": [{"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A"}])" +
                  think + "}");
    REQUIRE(loaded.ok());
    CHECK_FALSE(loaded->row(0).has_enable_thinking());
  }
  CHECK_THAT(RefusalOf(load(R"({"messages": [{"role": "user", "content": "Q"},
      {"role": "assistant", "content": "A"}], "think": "no"})"),
                       path + ":1"),
             Catch::Contains("'think' (data.enable_thinking_key) must be true, false or null, not "
                             "a string"));
  CHECK_THAT(RefusalOf(load(R"({"messages": [{"role": "user", "content": "Q"},
      {"role": "assistant", "content": "A", "reasoning_content": 3}]})"),
                       path + ":1"),
             Catch::Contains("(turn 1) reasoning_content must be text, not a number"));
}

TEST_CASE("Single-turn SFT rows (data.response_key): the prompt and its response",
          "[prompt_data]") {
  TempDir dir;
  const std::string path = dir.path() + "/sft.jsonl";
  v1::DataSpec data;
  // verl's gsm8k SFT example: prompt_key extra_info with prompt_dict_keys [question], the same
  // for the answer.
  data.set_prompt_key("extra_info.question");
  data.set_response_key("extra_info.answer");
  const auto load = [&](const std::string& text) {
    REQUIRE(WriteFileAtomically(path, text).ok());
    return PromptData::Load({path}, data, RowKind::kConversation);
  };
  auto loaded =
      load(R"({"extra_info": {"question": "What is 6 * 7?", "answer": "42"}, "messages": 1})"
           "\n"
           R"({"extra_info": {"question": [{"role": "system", "content": "S"}, )"
           R"({"role": "user", "content": "Q"}, {"role": "assistant", "content": "few-shot"}, )"
           R"({"role": "user", "content": "Q2"}], "answer": "A"}})"
           "\n");
  INFO(loaded.status());
  REQUIRE(loaded.ok());
  // A text prompt is a user turn; a chat prompt is the prompt whole (its few-shot answer too).
  REQUIRE(loaded->row(0).chat_size() == 1);
  CHECK(loaded->row(0).chat(0).role() == "user");
  CHECK(loaded->row(0).chat(0).content() == "What is 6 * 7?");
  REQUIRE(loaded->row(0).target_size() == 1);
  CHECK(loaded->row(0).target(0).role() == "assistant");
  CHECK(loaded->row(0).target(0).content() == "42");
  CHECK(loaded->row(1).chat_size() == 4);
  CHECK(loaded->row(1).target(0).content() == "A");

  const auto refusal = [&](const std::string& text) {
    return RefusalOf(load(text + "\n"), path + ":1");
  };
  CHECK_THAT(refusal(R"({"extra_info": {"question": "Q"}})"),
             Catch::Contains("no response text under 'extra_info.answer' (data.response_key)"));
  CHECK_THAT(refusal(R"({"extra_info": {"question": "Q", "answer": 42}})"),
             Catch::Contains("(data.response_key): it is a number"));
  CHECK_THAT(refusal(R"({"extra_info": {"answer": "A"}})"),
             Catch::Contains("no prompt under 'extra_info.question' (data.prompt_key)"));
}

TEST_CASE("A rank's share must fit one stage call: the largest rows decide", "[prompt_data]") {
  TempDir dir;
  const std::string path = dir.path() + "/train.jsonl";
  std::string text;
  for (int i = 0; i < 8; ++i) text += Row(absl::StrCat("question ", i), "1");
  text += Row("the heavy one", std::string(900'000, '9'));  // line 9
  text += Row("the other heavy one", std::string(800'000, '8'));
  auto data = LoadText(path, text);
  REQUIRE(data.ok());
  const int64_t limit = 1'500'000;
  // Two rows at a time can be the two heavy ones: 1.7 MB, over the limit.
  const absl::Status two = CheckShareFits(*data, 2, limit, "data.train_files");
  INFO(two.message());
  CHECK(two.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(two.message()), Catch::Contains("data.train_files") &&
                                             Catch::Contains(path + ":9") &&
                                             Catch::Contains("data.train_batch_size"));
  // One at a time fits, and so does any share of an empty set.
  CHECK(CheckShareFits(*data, 1, limit, "data.train_files").ok());
  CHECK(CheckShareFits(PromptData(), 4, limit, "data.val_files").ok());
}

TEST_CASE("Submission refuses verl's sources no rule scores and reads Search-R1's targets",
          "[prompt_data]") {
  TempDir dir;
  const std::string path = dir.path() + "/train.jsonl";
  const auto write = [&](const std::string& text) {
    REQUIRE(WriteFileAtomically(path, text).ok());
  };
  // verl's layout for Search-R1: the ground truth's targets under reward_model.
  write(R"({"prompt": "Capital of France?", "data_source": "searchR1_nq", )"
        R"("reward_model": {"ground_truth": {"target": ["Paris", "paris, france"]}}})"
        "\n"
        R"({"prompt": "Find n.", "data_source": "aime_2024", "ground_truth": "204"})"
        "\n");
  CHECK(CheckDataHead(path, v1::DataSpec(), "auto").ok());

  write(R"({"prompt": "Capital of France?", "data_source": "searchR1_nq", "ground_truth": "Paris"})"
        "\n");
  const absl::Status bare = CheckDataHead(path, v1::DataSpec(), "auto");
  CHECK_THAT(std::string(bare.message()), Catch::Contains(path + ":1") &&
                                              Catch::Contains("search_r1_qa_em") &&
                                              Catch::Contains("{\"target\": text or [texts]}"));

  write(
      R"({"prompt": "Find the angle.", "data_source": "hiyouga/geometry3k", "ground_truth": "30"})"
      "\n");
  CHECK(CheckDataHead(path, v1::DataSpec(), "exact_match").ok());  // a named rule reads any source
  CHECK_THAT(std::string(CheckDataHead(path, v1::DataSpec(), "auto").message()),
             Catch::Contains(path + ":1: data_source 'hiyouga/geometry3k' has no native reward "
                                    "rule") &&
                 Catch::Contains("mathruler") && Catch::Contains("custom_reward_function"));
}

TEST_CASE("The job's start reads every row as submission reads the first, and reads whole files",
          "[prompt_data]") {
  TempDir dir;
  const std::string path = dir.path() + "/train.jsonl";
  std::string rows;
  for (int i = 0; i < 16; ++i) rows += Row("What is 2 + 2?", "4");
  // Row 17 has no ground truth: past the rows submission reads, refused at the start.
  REQUIRE(WriteFileAtomically(path, rows + R"({"prompt": "What is 3 + 4?"})"
                                           "\n")
              .ok());
  CHECK(CheckDataHead(path, v1::DataSpec(), "exact_match").ok());
  const std::string unscored = RefusalOf(
      PromptData::Load({path}, v1::DataSpec(), RowKind::kPrompt, "exact_match"), path + ":17");
  CHECK_THAT(unscored, Catch::Contains("under 'ground_truth' (data.answer_key)"));
  CHECK(PromptData::Load({path}, v1::DataSpec()).ok());  // no rule scores them

  // A directory, or a line over 16 MiB, is an error, never the end of the rows.
  const absl::Status directory = PromptData::Load({dir.path()}, v1::DataSpec()).status();
  CHECK(directory.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(directory.message()), Catch::Contains("is a directory"));
  const std::string long_line = Row("q", "4") + Row(std::string(17 << 20, 'p'), "4");
  CHECK_THAT(RefusalOf(LoadText(path, long_line), path + ":2"),
             Catch::Contains("the line is longer than 16777216 bytes"));

  // A JSON document on one line of 2 MiB (SQuAD's layout, not JSONL): refused at submission,
  // which used to find no whole line in the first MiB and pass it.
  std::string document = R"({"version": "1.1", "data": [)";
  while (document.size() < (2 << 20)) document += R"({"title": "a paragraph of text"}, )";
  REQUIRE(WriteFileAtomically(path, document + "{}]}\n").ok());
  const absl::Status squad = CheckDataHead(path, v1::DataSpec(), "");
  CHECK(squad.code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(squad.message()), Catch::Contains(path + ":1: no prompt under 'prompt'"));

  // A byte order mark before the first row reads as JSON's parser reads it; no rows is refused.
  REQUIRE(WriteFileAtomically(path, "\xEF\xBB\xBF" + Row("What is 2 + 2?", "4")).ok());
  CHECK(CheckDataHead(path, v1::DataSpec(), "exact_match").ok());
  CHECK(PromptData::Load({path}, v1::DataSpec())->size() == 1);
  REQUIRE(WriteFileAtomically(path, "\xEF\xBB\xBF\n" + Row("What is 2 + 2?", "4")).ok());
  CHECK(CheckDataHead(path, v1::DataSpec(), "exact_match").ok());
  CHECK(PromptData::Load({path}, v1::DataSpec())->size() == 1);
  REQUIRE(WriteFileAtomically(path, "\n  \n").ok());
  CHECK_THAT(std::string(CheckDataHead(path, v1::DataSpec(), "").message()),
             Catch::Contains("holds no rows"));
  // Blank lines count toward what submission reads: 17 MiB of them is not read to its end.
  REQUIRE(WriteFileAtomically(path, std::string(17 << 20, '\n') + Row("q", "4")).ok());
  CHECK_THAT(std::string(CheckDataHead(path, v1::DataSpec(), "").message()),
             Catch::Contains("holds no row in its first 16777216 bytes"));
}

TEST_CASE("extra_info is an object, or JSON text holding one; anything else is refused by name",
          "[prompt_data]") {
  TempDir dir;
  const std::string path = dir.path() + "/train.jsonl";
  auto object = LoadText(path, R"({"prompt": "q", "extra_info": {"index": 3, "split": "train"}})"
                               "\n"
                               R"({"prompt": "q", "extra_info": "{\"index\": 4}"})"
                               "\n"
                               R"({"prompt": "q", "extra_info": null})"
                               "\n");
  REQUIRE(object.ok());
  CHECK(object->row(0).extra_info_json() == R"({"index":3,"split":"train"})");
  CHECK(object->row(1).extra_info_json() == R"({"index":4})");
  CHECK(object->row(2).extra_info_json().empty());
  CHECK_THAT(RefusalOf(LoadText(path, R"({"prompt": "q", "extra_info": "train"})"
                                      "\n"),
                       path + ":1: extra_info"),
             Catch::Contains("must be a JSON object (or JSON text holding one)"));
  CHECK_THAT(RefusalOf(LoadText(path, R"({"prompt": "q", "extra_info": [1, 2]})"
                                      "\n"),
                       path + ":1: extra_info"),
             Catch::Contains("not array"));
}

}  // namespace
}  // namespace rlhfd::controller
