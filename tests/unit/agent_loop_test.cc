// The multi-turn turn handler (worker/agent/agent_loop.h) on hand-made stops: what it inserts
// after a turn that calls tools (the chat template's tool turn, with the real code interpreter
// and calculator behind it), when it ends a sample (no call, turn limits, the budget), verl's
// error observations for malformed and unknown calls, truncation, and the per-sample counts.
// The chat template's prompt with tools is checked here by hand against Qwen2.5's template text.
#include "worker/agent/agent_loop.h"

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/agent/tool_config.h"

namespace rlhfd::agent {
namespace {

const std::string kModels = std::string(RLHFD_FIXTURES_DIR) + "/models/";

model::Tokenizer ChatMlTokenizer() {
  absl::StatusOr<model::Tokenizer> tokenizer = model::Tokenizer::Load(kModels + "tiny-qwen2");
  INFO(tokenizer.status());
  REQUIRE(tokenizer.ok());
  REQUIRE(tokenizer->chat_template() == model::ChatTemplate::kChatMl);
  return std::move(*tokenizer);
}

// A turn the model sampled (mask 1), after `before` (an earlier turn and an insertion).
rollout::Completion Sampled(const model::Tokenizer& tokenizer, const std::string& text,
                            const rollout::Completion& before = {}) {
  rollout::Completion completion = before;
  const auto ids = tokenizer.Encode(text);
  REQUIRE(ids.ok());
  for (int32_t id : *ids) {
    completion.token_ids.push_back(id);
    completion.logprobs.push_back(-0.5f);
    completion.response_mask.push_back(1);
  }
  return completion;
}

rollout::Completion WithInserted(rollout::Completion completion,
                                 const std::vector<int64_t>& inserted) {
  for (int64_t id : inserted) {
    completion.token_ids.push_back(id);
    completion.logprobs.push_back(0.f);
    completion.response_mask.push_back(0);
  }
  return completion;
}

std::string Text(const model::Tokenizer& tokenizer, const std::vector<int64_t>& ids) {
  return tokenizer.Decode(std::vector<int32_t>(ids.begin(), ids.end()));
}

struct Fixture {
  Fixture() : tokenizer(ChatMlTokenizer()) {
    SandboxOptions options;
    options.launcher = RLHFD_SANDBOX_BIN;
    options.limits.wall_time = absl::Seconds(5);
    absl::StatusOr<std::unique_ptr<Sandbox>> made = Sandbox::Create(options);
    INFO(made.status());
    REQUIRE(made.ok());
    sandbox = std::move(*made);
    tools.Add(MakeCodeInterpreter(sandbox.get()));
    tools.Add(MakeCalculator());
  }
  std::unique_ptr<AgentLoop> Loop(MultiTurnOptions options = {}) {
    absl::StatusOr<std::unique_ptr<AgentLoop>> loop = AgentLoop::Create(tokenizer, tools, options);
    INFO(loop.status());
    REQUIRE(loop.ok());
    return std::move(*loop);
  }
  model::Tokenizer tokenizer;
  std::unique_ptr<Sandbox> sandbox;
  ToolSet tools;
};

const std::string kCalculatorCall =
    "Let me compute.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": "
    "\"6 * 7\"}}\n</tool_call><|im_end|>";

TEST_CASE("a turn that calls a tool goes on with the template's tool turn", "[agent_loop]") {
  Fixture f;
  std::unique_ptr<AgentLoop> loop = f.Loop();
  loop->Begin({200});
  const rollout::Completion first = Sampled(f.tokenizer, kCalculatorCall);
  rollout::TurnOutcome outcome = loop->OnStop(0, 0, first).get();
  REQUIRE_FALSE(outcome.finish);
  // After the model's <|im_end|>: the template's newline, then the tool turn up to the next
  // assistant turn, as verl's Qwen builder inserts it.
  CHECK(Text(f.tokenizer, outcome.inserted) ==
        "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n");
  SampleTurns turns = loop->turns(0, 0);
  CHECK(turns.assistant_turns == 1);
  CHECK(turns.user_turns == 1);
  CHECK(turns.tool_calls == 1);
  CHECK(turns.tool_errors == 0);

  // The next turn answers without a call: the sample ends. Only that turn is read (the first
  // turn's call is not called again).
  const rollout::Completion second =
      Sampled(f.tokenizer, "The answer is 42.<|im_end|>", WithInserted(first, outcome.inserted));
  CHECK(loop->OnStop(0, 0, second).get().finish);
  turns = loop->turns(0, 0);
  CHECK(turns.assistant_turns == 2);
  CHECK(turns.user_turns == 1);
  CHECK(turns.tool_calls == 1);
  // verl's num_turns: assistant + user turns + 1.
  CHECK(turns.assistant_turns + turns.user_turns + 1 == 4);
}

TEST_CASE("the code interpreter's output and verl's error observations go back to the model",
          "[agent_loop]") {
  Fixture f;
  MultiTurnOptions options;
  options.max_parallel_calls = 3;
  options.max_tool_response_length = 120;
  options.truncate_side = TruncateSide::kLeft;
  std::unique_ptr<AgentLoop> loop = f.Loop(options);
  loop->Begin({4000});  // the fixture's small vocabulary spends a token on most characters
  const std::string text =
      "<tool_call>\n{\"name\": \"code_interpreter\", \"arguments\": {\"code\": "
      "\"print('x' * 300)\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": "
      "{}}\n</tool_call>\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\n"
      "</tool_call><|im_end|>";
  rollout::TurnOutcome outcome = loop->OnStop(0, 1, Sampled(f.tokenizer, text)).get();
  REQUIRE_FALSE(outcome.finish);
  const std::string inserted = Text(f.tokenizer, outcome.inserted);
  // The code's output cut to 120 code points from the left; the unknown tool gets verl's
  // message; the malformed block an error observation.
  CHECK(absl::StrContains(inserted, absl::StrCat("<tool_response>\n", std::string(120, 'x'),
                                                 "...(truncated)\n</tool_response>")));
  CHECK(absl::StrContains(inserted, "Error when executing tool: \"Tool 'search' not found."));
  CHECK(absl::StrContains(inserted, "<tool_response>\nError when executing tool: "));
  CHECK(absl::StartsWith(inserted, "\n<|im_start|>user\n<tool_response>\n"));
  CHECK(absl::EndsWith(inserted, "</tool_response><|im_end|>\n<|im_start|>assistant\n"));
  const SampleTurns turns = loop->turns(0, 1);
  CHECK(turns.tool_calls == 3);
  CHECK(turns.tool_errors == 2);
  CHECK(turns.tool_time > absl::ZeroDuration());
}

// The responses carry no call id: a malformed block's error answered after the calls that
// followed it would read as the first call's result.
TEST_CASE("a turn's blocks are answered in the order written, malformed ones in their place",
          "[agent_loop]") {
  Fixture f;
  MultiTurnOptions options;
  options.max_parallel_calls = 2;
  std::unique_ptr<AgentLoop> loop = f.Loop(options);
  loop->Begin({4000});
  const std::string text =
      "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\n</tool_call>\n<tool_call>\n"
      "{\"name\": \"calculator\", \"arguments\": {\"expression\": \"6 * 7\"}}\n</tool_call>"
      "<|im_end|>";
  const rollout::TurnOutcome outcome = loop->OnStop(0, 0, Sampled(f.tokenizer, text)).get();
  REQUIRE_FALSE(outcome.finish);
  const std::string inserted = Text(f.tokenizer, outcome.inserted);
  const size_t error = inserted.find("<tool_response>\nError when executing tool: ");
  const size_t answer = inserted.find("<tool_response>\n42");
  INFO(inserted);
  REQUIRE(error != std::string::npos);
  REQUIRE(answer != std::string::npos);
  CHECK(error < answer);
  CHECK(loop->turns(0, 0).tool_errors == 1);
  // With one slot (verl's default), the well-formed call takes it, not the malformed block.
  options.max_parallel_calls = 1;
  std::unique_ptr<AgentLoop> one = f.Loop(options);
  one->Begin({4000});
  const std::string only =
      Text(f.tokenizer, one->OnStop(0, 0, Sampled(f.tokenizer, text)).get().inserted);
  CHECK(absl::StrContains(only, "<tool_response>\n42"));
  CHECK_FALSE(absl::StrContains(only, "Error when executing tool"));
}

TEST_CASE("a sample ends without a call, at the turn limits, and before the budget",
          "[agent_loop]") {
  Fixture f;
  SECTION("no call") {
    std::unique_ptr<AgentLoop> loop = f.Loop();
    loop->Begin({100});
    CHECK(loop->OnStop(0, 0, Sampled(f.tokenizer, "Just 42.<|im_end|>")).get().finish);
    CHECK(loop->turns(0, 0).tool_calls == 0);
  }
  SECTION("max_assistant_turns") {
    MultiTurnOptions options;
    options.max_assistant_turns = 1;
    std::unique_ptr<AgentLoop> loop = f.Loop(options);
    loop->Begin({100});
    CHECK(loop->OnStop(0, 0, Sampled(f.tokenizer, kCalculatorCall)).get().finish);
    CHECK(loop->turns(0, 0).tool_calls == 0);  // the call is not run
  }
  SECTION("max_user_turns") {
    MultiTurnOptions options;
    options.max_user_turns = 1;
    std::unique_ptr<AgentLoop> loop = f.Loop(options);
    loop->Begin({4000});
    const rollout::Completion first = Sampled(f.tokenizer, kCalculatorCall);
    const rollout::TurnOutcome outcome = loop->OnStop(0, 0, first).get();
    REQUIRE_FALSE(outcome.finish);
    const rollout::Completion second =
        Sampled(f.tokenizer, kCalculatorCall, WithInserted(first, outcome.inserted));
    CHECK(loop->OnStop(0, 0, second).get().finish);
  }
  SECTION("the tool turn would reach the budget") {
    std::unique_ptr<AgentLoop> loop = f.Loop();
    const rollout::Completion first = Sampled(f.tokenizer, kCalculatorCall);
    // The insertion above is tens of tokens; leave room for fewer.
    loop->Begin({static_cast<int64_t>(first.token_ids.size()) + 5});
    CHECK(loop->OnStop(0, 0, first).get().finish);
    CHECK(loop->turns(0, 0).user_turns == 0);
  }
}

TEST_CASE("samples' tool calls run concurrently on the tool threads", "[agent_loop]") {
  Fixture f;
  MultiTurnOptions options;
  options.tool_threads = 4;
  std::unique_ptr<AgentLoop> loop = f.Loop(options);
  loop->Begin({4000});
  const rollout::Completion sleepy = Sampled(
      f.tokenizer,
      "<tool_call>\n{\"name\": \"code_interpreter\", \"arguments\": {\"code\": \"import time; "
      "time.sleep(1); print('done')\"}}\n</tool_call><|im_end|>");
  const absl::Time start = absl::Now();
  std::vector<std::future<rollout::TurnOutcome>> outcomes;
  for (int64_t sample = 0; sample < 4; ++sample) {
    outcomes.push_back(loop->OnStop(0, sample, sleepy));
  }
  // OnStop returned at once; the four one-second calls overlap.
  CHECK(absl::Now() - start < absl::Milliseconds(500));
  for (auto& outcome : outcomes) {
    const rollout::TurnOutcome done = outcome.get();
    REQUIRE_FALSE(done.finish);
    CHECK(absl::StrContains(Text(f.tokenizer, done.inserted), "<tool_response>\ndone\n"));
  }
  // Generous for a loaded machine; four in a row would take at least 4 s.
  CHECK(absl::Now() - start < absl::Seconds(3.5));
}

TEST_CASE("the prompt lists the tools as Qwen2.5's template does", "[agent_loop]") {
  const model::Tokenizer tokenizer = ChatMlTokenizer();
  const nlohmann::ordered_json schema = {
      {"type", "function"},
      {"function",
       {{"name", "calculator"},
        {"description", "Evaluates arithmetic — exactly."},
        {"parameters",
         {{"type", "object"},
          {"properties", {{"expression", {{"type", "string"}, {"description", "e.g. 1+2"}}}}},
          {"required", {"expression"}}}}}}};
  const std::string tool = PromptToolSchemaText(schema);
  // json.dumps(schema, ensure_ascii=False) of verl's pydantic dump: its key order, ", " and ": ".
  CHECK(tool ==
        "{\"type\": \"function\", \"function\": {\"name\": \"calculator\", \"description\": "
        "\"Evaluates arithmetic — exactly.\", \"parameters\": {\"type\": \"object\", "
        "\"properties\": {\"expression\": {\"type\": \"string\", \"description\": \"e.g. "
        "1+2\"}}, \"required\": [\"expression\"]}}}");
  const absl::StatusOr<std::string> prompt =
      tokenizer.ApplyChatTemplate({{"system", "Be brief."}, {"user", "What is 6*7?"}},
                                  /*add_generation_prompt=*/true, {tool});
  REQUIRE(prompt.ok());
  CHECK(*prompt ==
        absl::StrCat(
            "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to "
            "assist with the user query.\n\nYou are provided with function signatures within "
            "<tools></tools> XML tags:\n<tools>\n",
            tool,
            "\n</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
            "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
            "<|im_start|>user\nWhat is 6*7?<|im_end|>\n<|im_start|>assistant\n"));
}

TEST_CASE("multi-turn refuses a chat template without tool turns", "[agent_loop]") {
  model::Tokenizer llama = ChatMlTokenizer();
  llama.set_chat_template(model::ChatTemplate::kLlama3);
  ToolSet tools;
  const auto loop = AgentLoop::Create(llama, tools, {});
  REQUIRE_FALSE(loop.ok());
  CHECK(absl::StrContains(loop.status().message(), "ChatML"));
}

}  // namespace
}  // namespace rlhfd::agent
