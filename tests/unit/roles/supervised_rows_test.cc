// trainer.mode sft's rows (EncodeTarget): a conversation's target turns as the tokens, response
// mask and log-probs the step's rows take, against text written out by hand from Qwen2.5's chat
// template (what transformers renders for the same turns; make_fixtures.py's tool_sft_golden
// checks the whole conversation through the daemons) and Llama 3's; and the refusals.
#include "worker/roles/supervised_rows.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "worker/roles/prompt_encoding.h"

namespace rlhfd::roles {
namespace {

const std::string kFixtures = RLHFD_FIXTURES_DIR;

v1::PromptRow Conversation(const std::vector<std::pair<std::string, std::string>>& target) {
  v1::PromptRow row;
  v1::ChatTurn* user = row.add_chat();
  user->set_role("user");
  user->set_content("What is 6 * 7?");
  for (const auto& [role, content] : target) {
    v1::ChatTurn* turn = row.add_target();
    turn->set_role(role);
    turn->set_content(content);
  }
  return row;
}

// A job as the validator completes it: multi_turn on, with verl's tool response limits.
v1::JobSpec Spec(int32_t max_response_length, v1::Truncation truncation) {
  v1::JobSpec spec;
  spec.mutable_data()->set_max_response_length(max_response_length);
  spec.mutable_data()->set_truncation(truncation);
  v1::MultiTurnSpec& turns =
      *spec.mutable_roles()->mutable_actor()->mutable_rollout()->mutable_multi_turn();
  turns.set_enable(true);
  turns.set_max_tool_response_length(256);
  turns.set_tool_response_truncate_side("middle");
  return spec;
}

// The text of the tokens whose mask is `kept`, in order.
std::string TextOf(const model::Tokenizer& tokenizer, const rollout::Completion& completion,
                   uint8_t kept) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < completion.token_ids.size(); ++i) {
    if (completion.response_mask[i] == kept)
      ids.push_back(static_cast<int32_t>(completion.token_ids[i]));
  }
  return tokenizer.Decode(ids);
}

TEST_CASE("sft rows: assistant turns are scored, tool turns are read", "[roles][sft]") {
  absl::StatusOr<model::Tokenizer> tokenizer =
      model::Tokenizer::Load(kFixtures + "/models/tiny-qwen2-tools");
  REQUIRE(tokenizer.ok());
  const std::string call =
      "<tool_call>\n{\"name\": \"code_interpreter\", \"arguments\": {\"code\": \"print(6 * 7)\"}}"
      "\n</tool_call>";
  const v1::PromptRow row = Conversation({{"assistant", call},
                                          {"tool", "42\n"},
                                          {"tool", "ok\n"},
                                          {"assistant", "The answer is 42."}});
  absl::StatusOr<rollout::Completion> got =
      EncodeTarget(*tokenizer, row, Spec(512, v1::TRUNCATION_ERROR), 3);
  REQUIRE(got.ok());
  // Qwen2.5's template: each assistant turn ends <|im_end|>\n; consecutive tool messages share
  // one user turn of <tool_response> blocks; then the next assistant turn's header.
  const std::string tool_turn =
      "\n<|im_start|>user\n<tool_response>\n42\n\n</tool_response>\n<tool_response>\nok\n\n"
      "</tool_response><|im_end|>\n<|im_start|>assistant\n";
  CHECK(tokenizer->Decode(std::vector<int32_t>(got->token_ids.begin(), got->token_ids.end())) ==
        call + "<|im_end|>" + tool_turn + "The answer is 42.<|im_end|>");
  CHECK(TextOf(*tokenizer, *got, 1) == call + "<|im_end|>The answer is 42.<|im_end|>");
  CHECK(TextOf(*tokenizer, *got, 0) == tool_turn);
  CHECK(got->logprobs == std::vector<float>(got->token_ids.size(), 0.0f));
  CHECK(got->finish_reason == rollout::FinishReason::kStop);

  // Over data.max_response_length: refused under truncation error, else its first tokens.
  const int32_t limit = 10;
  absl::StatusOr<rollout::Completion> refused =
      EncodeTarget(*tokenizer, row, Spec(limit, v1::TRUNCATION_ERROR), 3);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("prompt 3: ") && Catch::Contains("over the response budget (10"));
  absl::StatusOr<rollout::Completion> cut =
      EncodeTarget(*tokenizer, row, Spec(limit, v1::TRUNCATION_RIGHT), 3);
  REQUIRE(cut.ok());
  CHECK(cut->token_ids ==
        std::vector<int64_t>(got->token_ids.begin(), got->token_ids.begin() + limit));
  CHECK(cut->response_mask.size() == limit);
  CHECK(cut->finish_reason == rollout::FinishReason::kLength);

  // Tool responses are cut as a rollout cuts them (multi_turn.max_tool_response_length, side,
  // verl's marker).
  v1::JobSpec cutting = Spec(512, v1::TRUNCATION_ERROR);
  auto& turns = *cutting.mutable_roles()->mutable_actor()->mutable_rollout()->mutable_multi_turn();
  turns.set_max_tool_response_length(1);
  turns.set_tool_response_truncate_side("left");
  absl::StatusOr<rollout::Completion> short_tool = EncodeTarget(
      *tokenizer, Conversation({{"assistant", call}, {"tool", "42\n"}, {"assistant", "4."}}),
      cutting, 0);
  REQUIRE(short_tool.ok());
  CHECK(TextOf(*tokenizer, *short_tool, 0) ==
        "\n<|im_start|>user\n<tool_response>\n4...(truncated)\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n");
  // The rollout's limits on turns.
  turns.set_max_tool_response_length(256);
  turns.set_max_assistant_turns(1);
  absl::StatusOr<rollout::Completion> too_many = EncodeTarget(*tokenizer, row, cutting, 2);
  REQUIRE_FALSE(too_many.ok());
  CHECK_THAT(std::string(too_many.status().message()),
             Catch::Contains("2 assistant turns, over multi_turn.max_assistant_turns (1)"));
  turns.set_max_assistant_turns(0);
  turns.set_max_user_turns(0);
  turns.set_enable(false);
  absl::StatusOr<rollout::Completion> no_tools = EncodeTarget(*tokenizer, row, cutting, 2);
  REQUIRE_FALSE(no_tools.ok());
  CHECK_THAT(std::string(no_tools.status().message()),
             Catch::Contains("a tool turn, but the prompt lists no tools"));
}

// verl's MultiTurnSFTDataset lists a row's own tools and nothing else: a row whose tools key is
// an empty list (or null) gets no tool block, even where the job's multi_turn lists tools; a row
// without the key gets multi_turn's (rlhfd's default).
TEST_CASE("sft rows: a row that gives no tools lists none, multi_turn's tools or not",
          "[roles][sft]") {
  absl::StatusOr<model::Tokenizer> tokenizer =
      model::Tokenizer::Load(kFixtures + "/models/tiny-qwen2-tools");
  REQUIRE(tokenizer.ok());
  v1::JobSpec spec = Spec(2048, v1::TRUNCATION_ERROR);  // multi_turn on
  spec.mutable_data()->set_max_prompt_length(2048);
  const std::vector<std::string> job_tools = {
      "{\"type\": \"function\", \"function\": {\"name\": \"code_interpreter\"}}"};
  v1::PromptRow row = Conversation({{"assistant", "42."}});
  absl::StatusOr<EncodedPrompt> with_job_tools =
      EncodePrompt(*tokenizer, row, spec.data(), 0, job_tools);
  INFO(with_job_tools.status());
  REQUIRE(with_job_tools.ok());
  CHECK(absl::StrContains(with_job_tools->text, "<tools>\n" + job_tools[0] + "\n</tools>"));
  row.set_tools_given(true);  // "tools": [] or null
  absl::StatusOr<EncodedPrompt> without = EncodePrompt(*tokenizer, row, spec.data(), 0, job_tools);
  REQUIRE(without.ok());
  CHECK_FALSE(absl::StrContains(without->text, "<tools>"));
  CHECK(without->text == *tokenizer->ApplyChatTemplate({{"user", "What is 6 * 7?"}}, true));
  // Its tool turns then have no tool to answer for.
  v1::PromptRow calling =
      Conversation({{"assistant", "Let me compute."}, {"tool", "42"}, {"assistant", "42."}});
  calling.mutable_target(0)->add_tool_calls()->set_name("code_interpreter");
  REQUIRE(EncodeTarget(*tokenizer, calling, spec, 0).ok());
  calling.set_tools_given(true);
  const absl::StatusOr<rollout::Completion> refused = EncodeTarget(*tokenizer, calling, spec, 0);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("a tool turn, but the prompt lists no tools"));
}

TEST_CASE("sft rows: structured tool calls, the row's own tools, user turns", "[roles][sft]") {
  absl::StatusOr<model::Tokenizer> tokenizer =
      model::Tokenizer::Load(kFixtures + "/models/tiny-qwen2-tools");
  REQUIRE(tokenizer.ok());
  // verl's ReTool SFT layout: the call as OpenAI's tool_calls (content before it), the row's
  // tool schemas instead of a multi_turn tool config, a long tool response kept whole.
  v1::PromptRow row = Conversation({{"assistant", "Let me compute."},
                                    {"tool", std::string(300, '7')},
                                    {"assistant", "It is 42."},
                                    {"user", "And doubled?"},
                                    {"assistant", "84."}});
  v1::ChatToolCall* call = row.mutable_target(0)->add_tool_calls();
  call->set_name("python");
  call->set_arguments_json("{\"code\": \"print(6 * 7)\", \"a\": 1}");
  *row.mutable_target(0)->add_tool_calls() = *call;
  row.add_tools_json("{\"type\": \"function\"}");
  v1::JobSpec spec = Spec(2048, v1::TRUNCATION_ERROR);
  spec.mutable_roles()->mutable_actor()->mutable_rollout()->mutable_multi_turn()->set_enable(false);
  absl::StatusOr<rollout::Completion> got = EncodeTarget(*tokenizer, row, spec, 0);
  INFO(got.status());
  REQUIRE(got.ok());
  // Qwen2.5's template: the content, then each call's block after a newline.
  const std::string blocks =
      "Let me compute.\n<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"print(6 * "
      "7)\", \"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"python\", \"arguments\": "
      "{\"code\": \"print(6 * 7)\", \"a\": 1}}\n</tool_call><|im_end|>";
  const std::string tool_turn = "\n<|im_start|>user\n<tool_response>\n" + std::string(300, '7') +
                                "\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
  const std::string user_turn =
      "\n<|im_start|>user\nAnd doubled?<|im_end|>\n<|im_start|>assistant\n";
  CHECK(tokenizer->Decode(std::vector<int32_t>(got->token_ids.begin(), got->token_ids.end())) ==
        blocks + tool_turn + "It is 42.<|im_end|>" + user_turn + "84.<|im_end|>");
  CHECK(TextOf(*tokenizer, *got, 1) == blocks + "It is 42.<|im_end|>84.<|im_end|>");
  CHECK(TextOf(*tokenizer, *got, 0) == tool_turn + user_turn);
  // Without content, the first block follows the generation prompt at once.
  row.mutable_target(0)->clear_content();
  got = EncodeTarget(*tokenizer, row, spec, 0);
  REQUIRE(got.ok());
  CHECK(absl::StartsWith(TextOf(*tokenizer, *got, 1), "<tool_call>\n{\"name\": \"python\""));

  const auto refusal = [&](const v1::PromptRow& refused_row) {
    absl::StatusOr<rollout::Completion> encoded = EncodeTarget(*tokenizer, refused_row, spec, 4);
    REQUIRE_FALSE(encoded.ok());
    CHECK(encoded.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(encoded.status().message());
  };
  // A tool turn answers the calls of the assistant turn right before it.
  v1::PromptRow after_user =
      Conversation({{"assistant", "a"}, {"user", "b"}, {"tool", "c"}, {"assistant", "d"}});
  *after_user.mutable_target(0)->add_tool_calls() = *call;
  after_user.add_tools_json("{}");
  CHECK_THAT(refusal(after_user), Catch::Contains("prompt 4: a tool turn after assistant turn 1 "
                                                  "and a user turn"));
  v1::PromptRow no_tools = row;
  no_tools.clear_tools_json();
  CHECK_THAT(refusal(no_tools), Catch::Contains("the prompt lists no tools"));
  CHECK_THAT(refusal(Conversation({{"assistant", "a"}, {"user", "b"}})),
             Catch::Contains("ends in a user turn"));
  // Llama 3's template here renders no tool calls.
  absl::StatusOr<model::Tokenizer> llama =
      model::Tokenizer::Load(kFixtures + "/tokenizers/llama3-style");
  REQUIRE(llama.ok());
  v1::PromptRow llama_call = Conversation({{"assistant", ""}});
  *llama_call.mutable_target(0)->add_tool_calls() = *call;
  absl::StatusOr<rollout::Completion> refused = EncodeTarget(*llama, llama_call, spec, 0);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("hermes"));
  // A plain ChatML template (tiny-qwen2's, as Qwen2's and SmolLM2's) gives a tool message a turn
  // of its own, as transformers renders it, and has no structured calls.
  absl::StatusOr<model::Tokenizer> plain = model::Tokenizer::Load(kFixtures + "/models/tiny-qwen2");
  REQUIRE(plain.ok());
  CHECK_FALSE(plain->hermes_tool_format());
  CHECK(tokenizer->hermes_tool_format());
  const absl::StatusOr<std::string> history = plain->ApplyChatTemplate(
      {{"user", "q"}, {"assistant", "calling"}, {"tool", "r"}, {"user", "go"}}, true);
  REQUIRE(history.ok());
  CHECK(
      *history ==
      "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\ncalling<|im_end|>\n<|im_start|>tool\n"
      "r<|im_end|>\n<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<model::ChatMessage> with_call = {
      {"user", "q"}, {"assistant", "", {model::ChatToolCall{"python", "{}"}}}};
  CHECK_FALSE(plain->ApplyChatTemplate(with_call, false).ok());
  CHECK(tokenizer->ApplyChatTemplate(with_call, false).ok());
  // Llama 3's user turns.
  absl::StatusOr<rollout::Completion> chat = EncodeTarget(
      *llama, Conversation({{"assistant", "a"}, {"user", " b "}, {"assistant", "c"}}), spec, 0);
  REQUIRE(chat.ok());
  CHECK(TextOf(*llama, *chat, 0) ==
        "<|start_header_id|>user<|end_header_id|>\n\nb<|eot_id|><|start_header_id|>assistant"
        "<|end_header_id|>\n\n");
}

// Qwen3's template (transformers renders the same pieces: sft_template_parity_test holds random
// conversations to it).
TEST_CASE("sft rows: Qwen3's think blocks and thinking switch, the job's or the row's",
          "[roles][sft]") {
  absl::StatusOr<model::Tokenizer> tokenizer =
      model::Tokenizer::Load(kFixtures + "/tokenizers/qwen3-thinking");
  REQUIRE(tokenizer.ok());
  v1::JobSpec spec = Spec(4096, v1::TRUNCATION_ERROR);
  spec.mutable_roles()->mutable_actor()->mutable_rollout()->mutable_multi_turn()->set_enable(false);
  spec.mutable_data()->set_max_prompt_length(4096);
  v1::PromptRow row = Conversation({{"assistant", "<think>\nsix sevens\n</think>\n\n42"},
                                    {"user", "And 2 * 3?"},
                                    {"assistant", "6"}});
  row.mutable_target(2)->set_reasoning_content("two threes");
  // Each answer as generated: its block (the first from its content, the second from
  // reasoning_content), trained from after the generation prompt.
  absl::StatusOr<rollout::Completion> target = EncodeTarget(*tokenizer, row, spec, 0);
  INFO(target.status());
  REQUIRE(target.ok());
  CHECK(
      TextOf(*tokenizer, *target, 1) ==
      "<think>\nsix sevens\n</think>\n\n42<|im_end|><think>\ntwo threes\n</think>\n\n6<|im_end|>");
  CHECK(TextOf(*tokenizer, *target, 0) ==
        "\n<|im_start|>user\nAnd 2 * 3?<|im_end|>\n<|im_start|>assistant\n");
  absl::StatusOr<EncodedPrompt> prompt = EncodePrompt(*tokenizer, row, spec.data(), 0);
  REQUIRE(prompt.ok());
  CHECK(absl::EndsWith(prompt->text, "<|im_start|>assistant\n"));

  // Thinking off for the job: each generation prompt holds the empty block, the answers are
  // what follows it, and an answer with reasoning is refused, naming the row.
  spec.mutable_data()->set_enable_thinking(false);
  target = EncodeTarget(*tokenizer, row, spec, 3);
  REQUIRE_FALSE(target.ok());
  CHECK_THAT(std::string(target.status().message()),
             Catch::StartsWith("prompt 3: an assistant turn with reasoning") &&
                 Catch::Contains("while enable_thinking is false"));
  row.mutable_target(0)->set_content("42");
  row.mutable_target(2)->clear_reasoning_content();
  target = EncodeTarget(*tokenizer, row, spec, 0);
  REQUIRE(target.ok());
  CHECK(TextOf(*tokenizer, *target, 1) == "42<|im_end|>6<|im_end|>");
  CHECK(TextOf(*tokenizer, *target, 0) ==
        "\n<|im_start|>user\nAnd 2 * 3?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  prompt = EncodePrompt(*tokenizer, row, spec.data(), 0);
  REQUIRE(prompt.ok());
  CHECK(absl::EndsWith(prompt->text, "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  // The row's own switch wins over the job's.
  row.set_enable_thinking(true);
  target = EncodeTarget(*tokenizer, row, spec, 0);
  REQUIRE(target.ok());
  CHECK(TextOf(*tokenizer, *target, 1) ==
        "<think>\n\n</think>\n\n42<|im_end|><think>\n\n</think>\n\n6<|im_end|>");
  prompt = EncodePrompt(*tokenizer, row, spec.data(), 0);
  REQUIRE(prompt.ok());
  CHECK(absl::EndsWith(prompt->text, "<|im_start|>assistant\n"));
}

TEST_CASE("sft rows: Llama 3's turn end; what cannot be trained on is refused", "[roles][sft]") {
  absl::StatusOr<model::Tokenizer> llama =
      model::Tokenizer::Load(kFixtures + "/tokenizers/llama3-style");
  REQUIRE(llama.ok());
  absl::StatusOr<rollout::Completion> got = EncodeTarget(
      *llama, Conversation({{"assistant", " 42 "}}), Spec(64, v1::TRUNCATION_ERROR), 0);
  REQUIRE(got.ok());
  CHECK(llama->Decode(std::vector<int32_t>(got->token_ids.begin(), got->token_ids.end())) ==
        "42<|eot_id|>");
  // Llama 3's template here has no tool turns.
  const auto refusal = [&](const model::Tokenizer& tokenizer, const v1::PromptRow& row) {
    absl::StatusOr<rollout::Completion> encoded =
        EncodeTarget(tokenizer, row, Spec(64, v1::TRUNCATION_ERROR), 5);
    REQUIRE_FALSE(encoded.ok());
    CHECK(encoded.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(encoded.status().message());
  };
  CHECK_THAT(refusal(*llama, Conversation({{"assistant", "<tool_call>\n{}\n</tool_call>"},
                                           {"tool", "b"},
                                           {"assistant", "c"}})),
             Catch::Contains("prompt 5") && Catch::Contains("hermes"));
  absl::StatusOr<model::Tokenizer> qwen =
      model::Tokenizer::Load(kFixtures + "/models/tiny-qwen2-tools");
  REQUIRE(qwen.ok());
  CHECK_THAT(refusal(*qwen, Conversation({})), Catch::Contains("no assistant turn"));
  CHECK_THAT(
      refusal(*qwen, Conversation({{"assistant", "<tool_call>\n{}\n</tool_call>"}, {"tool", "b"}})),
      Catch::Contains("ends in a tool turn"));
  CHECK_THAT(
      refusal(*qwen, Conversation({{"assistant", "a"}, {"system", "b"}, {"assistant", "c"}})),
      Catch::Contains("a 'system' turn"));
  // A turn without a call ends a rollout's sample: no tool turn can follow it.
  CHECK_THAT(
      refusal(*qwen, Conversation({{"assistant", "no call"}, {"tool", "b"}, {"assistant", "c"}})),
      Catch::Contains("a tool turn after assistant turn 1, which calls no tool"));
}

}  // namespace
}  // namespace rlhfd::roles
