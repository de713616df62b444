// verl's tool-call format and tool-response text (worker/agent/tool_calls.h) on hand cases
// worked out from verl's HermesToolParser (the regex <tool_call>(.*?)</tool_call>, DOTALL;
// json.loads; ["name"], ["arguments"]; the blocks removed from the content) and ToolAgentLoop's
// truncation (Python slicing, so code points), including where the two differ on purpose.
#include "worker/agent/tool_calls.h"

#include <catch2/catch.hpp>

namespace rlhfd::agent {
namespace {

TEST_CASE("a text without both tags has no calls and keeps its content", "[tool_calls]") {
  for (const char* text : {"The answer is 4.", "<tool_call>{\"name\": \"x\", \"arguments\": {}}",
                           "{\"name\": \"x\"}</tool_call>"}) {
    const ParsedResponse parsed = ParseHermesToolCalls(text);
    CHECK(parsed.content == text);
    CHECK(parsed.calls.empty());
    CHECK(parsed.malformed.empty());
  }
}

TEST_CASE("hermes calls are read in order and removed from the content", "[tool_calls]") {
  const ParsedResponse parsed = ParseHermesToolCalls(
      "Let me compute.\n<tool_call>\n{\"name\": \"code_interpreter\", \"arguments\": {\"code\": "
      "\"print(6 * 7)\"}}\n</tool_call> and <tool_call>{\"name\": \"calc\", \"arguments\": "
      "{\"expression\": \"1+1\"}}</tool_call>\nDone.");
  CHECK(parsed.content == "Let me compute.\n and \nDone.");
  REQUIRE(parsed.calls.size() == 2);
  CHECK(parsed.calls[0].name == "code_interpreter");
  CHECK(parsed.calls[0].arguments == nlohmann::json{{"code", "print(6 * 7)"}});
  CHECK(parsed.calls[1].name == "calc");
  CHECK(parsed.calls[1].arguments["expression"] == "1+1");
  CHECK(parsed.malformed.empty());
}

TEST_CASE("malformed blocks are set apart with what is wrong, and leave the content",
          "[tool_calls]") {
  const ParsedResponse parsed = ParseHermesToolCalls(
      "a<tool_call>{\"name\": \"x\", \"arguments\": {</tool_call>"
      "b<tool_call>[1, 2]</tool_call>"
      "c<tool_call>{\"name\": \"x\"}</tool_call>"
      "d<tool_call>{\"name\": 7, \"arguments\": {}}</tool_call>"
      "e<tool_call>{\"name\": \"ok\", \"arguments\": \"not an object\"}</tool_call>f");
  CHECK(parsed.content == "abcdef");
  REQUIRE(parsed.malformed.size() == 4);
  CHECK(parsed.malformed[0].text == "{\"name\": \"x\", \"arguments\": {");
  CHECK(parsed.malformed[0].error == "the tool call is not valid JSON");
  CHECK(parsed.malformed[1].error ==
        "a tool call is a JSON object with \"name\" and \"arguments\"");
  CHECK(parsed.malformed[2].error ==
        "a tool call is a JSON object with \"name\" and \"arguments\"");
  CHECK(parsed.malformed[3].error == "the tool call's \"name\" is not a string");
  // Arguments of any JSON type pass the parser, as in verl: the tool checks them.
  REQUIRE(parsed.calls.size() == 1);
  CHECK(parsed.calls[0].arguments == "not an object");
  // Where each block stood among the five; of three slots, the call takes one, the first two
  // malformed blocks the others (verl drops malformed blocks before it cuts).
  CHECK(parsed.malformed[0].block == 0);
  CHECK(parsed.malformed[3].block == 3);
  CHECK(parsed.calls[0].block == 4);
  ParsedResponse kept = parsed;
  kept.KeepBlocks(3);
  CHECK(kept.calls.size() == 1);
  REQUIRE(kept.malformed.size() == 2);
  CHECK(kept.malformed[1].block == 1);
  kept.KeepBlocks(1);
  CHECK(kept.calls.size() == 1);
  CHECK(kept.malformed.empty());
}

TEST_CASE("the shortest span between the tags, as verl's non-greedy regex", "[tool_calls]") {
  // A stray closing tag first, an unclosed opening tag last.
  ParsedResponse parsed = ParseHermesToolCalls(
      "</tool_call> x <tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call> y <tool_call>{");
  CHECK(parsed.content == "</tool_call> x  y <tool_call>{");
  REQUIRE(parsed.calls.size() == 1);
  CHECK(parsed.calls[0].name == "a");
  // Nested opening tags: the first opening tag to the first closing one.
  parsed = ParseHermesToolCalls(
      "<tool_call><tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call></tool_call>");
  CHECK(parsed.content == "</tool_call>");
  CHECK(parsed.calls.empty());
  REQUIRE(parsed.malformed.size() == 1);
  CHECK(parsed.malformed[0].text == "<tool_call>{\"name\": \"a\", \"arguments\": {}}");
  // Newlines inside (DOTALL).
  parsed = ParseHermesToolCalls(
      "<tool_call>\n{\n \"name\": \"a\",\n \"arguments\": {}\n}\n</tool_call>");
  CHECK(parsed.calls.size() == 1);
}

TEST_CASE("tool responses are truncated by code points, on verl's sides", "[tool_calls]") {
  CHECK(TruncateToolResponse("abcdefghij", 4, TruncateSide::kLeft) == "abcd...(truncated)");
  CHECK(TruncateToolResponse("abcdefghij", 4, TruncateSide::kRight) == "(truncated)...ghij");
  CHECK(TruncateToolResponse("abcdefghij", 4, TruncateSide::kMiddle) == "ab...(truncated)...ij");
  CHECK(TruncateToolResponse("abcdefghij", 5, TruncateSide::kMiddle) == "ab...(truncated)...ij");
  CHECK(TruncateToolResponse("abcdefghij", 10, TruncateSide::kLeft) == "abcdefghij");
  // Python counts code points: "é" is one, "😀" is one.
  CHECK(TruncateToolResponse("héllo wörld 😀!", 3, TruncateSide::kLeft) == "hél...(truncated)");
  CHECK(TruncateToolResponse("héllo wörld 😀!", 2, TruncateSide::kRight) == "(truncated)...😀!");
  CHECK(TruncateToolResponse("héllo", 5, TruncateSide::kRight) == "héllo");
  // n // 2 == 0: verl's text[-0:] would keep the whole text; here nothing is kept.
  CHECK(TruncateToolResponse("abc", 1, TruncateSide::kMiddle) == "...(truncated)...");
}

TEST_CASE("truncate sides by name, and the error observation", "[tool_calls]") {
  CHECK(*ParseTruncateSide("left") == TruncateSide::kLeft);
  CHECK(*ParseTruncateSide("right") == TruncateSide::kRight);
  CHECK(*ParseTruncateSide("middle") == TruncateSide::kMiddle);
  const absl::StatusOr<TruncateSide> bad = ParseTruncateSide("top");
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(bad.status().message() ==
        "tool_response_truncate_side 'top' is not one of left, right, middle");
  CHECK(ToolErrorObservation("Tool 'calc' not found") ==
        "Error when executing tool: Tool 'calc' not found");
}

}  // namespace
}  // namespace rlhfd::agent
