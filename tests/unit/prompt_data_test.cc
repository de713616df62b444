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
      absl::StrCat(R"({"prompt": "q", "extra_info": ")", std::string(2 * kMaxRowBytes, 'x'),
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
  const auto load = [&](std::string messages) {
    std::replace(messages.begin(), messages.end(), '\n', ' ');  // one JSONL line
    REQUIRE(WriteFileAtomically(path, R"({"other": 1, "messages": )" + messages + "}\n").ok());
    return PromptData::Load({path}, v1::DataSpec(), RowKind::kConversation);
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
    auto refused = load(messages);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(refused.status().message()), Catch::Contains(path + ":1"));
    return std::string(refused.status().message());
  };
  CHECK_THAT(refusal(R"([{"role": "user", "content": "Q"}])"),
             Catch::Contains("has no assistant turn"));
  CHECK_THAT(refusal(R"([{"role": "assistant", "content": "A"}])"),
             Catch::Contains("starts with an assistant turn"));
  CHECK_THAT(refusal(R"([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"},
      {"role": "user", "content": "again"}, {"role": "assistant", "content": "B"}])"),
             Catch::Contains("has a 'user' turn (turn 2) after its first assistant turn"));
  CHECK_THAT(refusal(R"([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"},
      {"role": "tool", "content": "42"}])"),
             Catch::Contains("ends in a tool turn"));
  CHECK_THAT(refusal(R"([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "",
      "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
      {"role": "tool", "content": "42"}, {"role": "assistant", "content": "A"}])"),
             Catch::Contains("turn 1 has tool_calls, which are not read"));
  CHECK_THAT(refusal(R"([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"},
      {"role": "assistant", "content": "B"}])"),
             Catch::Contains("has assistant turns 1 and 2 in a row"));
  // Empty or null tool_calls (as Parquet writes a struct's missing field) are no calls.
  loaded = load(R"([{"role": "user", "content": "Q", "tool_calls": null},
      {"role": "assistant", "content": "A", "tool_calls": []}])");
  INFO(loaded.status());
  REQUIRE(loaded.ok());
  CHECK(loaded->row(0).target_size() == 1);
  CHECK_THAT(refusal(R"("just text")"), Catch::Contains("no conversation under 'messages'"));
  CHECK_THAT(refusal(R"([{"role": "user"}])"),
             Catch::Contains("messages must be a list of {\"role\": ..., \"content\": ...} turns"));
  // Prompt rows are read as before, a tool_calls key beside their turns ignored.
  REQUIRE(WriteFileAtomically(path, R"({"prompt": [{"role": "user", "content": "Q", )"
                                    R"("tool_calls": [{"function": {"name": "f"}}]}]})"
                                    "\n")
              .ok());
  auto prompts = PromptData::Load({path}, v1::DataSpec());
  INFO(prompts.status());
  REQUIRE(prompts.ok());
  CHECK(prompts->row(0).chat_size() == 1);
  CHECK(prompts->row(0).target_size() == 0);
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

}  // namespace
}  // namespace rlhfd::controller
