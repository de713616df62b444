// Tool calls in a response and the text that goes back to the model, as verl's agent loop
// reads and writes them (verl/experimental/agent_loop: HermesToolParser, ToolAgentLoop).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace rlhfd::agent {

struct ToolCall {
  std::string name;
  nlohmann::json arguments;  // as the model wrote them: verl checks their type at execution
  size_t block = 0;          // its place among the response's blocks, well-formed or not
};

// A <tool_call> block that is not a JSON object with "name" and "arguments": verl logs and
// drops it; the caller decides whether the model is told (ToolErrorObservation).
struct MalformedToolCall {
  std::string text;   // between the tags
  std::string error;  // what is wrong, for the observation
  size_t block = 0;   // its place among the response's blocks, well-formed or not (from 0)
};

struct ParsedResponse {
  // The response without its <tool_call>...</tool_call> blocks.
  std::string content;
  // Each in the order written (`block` says where among them all).
  std::vector<ToolCall> calls;
  std::vector<MalformedToolCall> malformed;

  // Keeps `count` blocks: the first well-formed calls, and the first malformed blocks in the
  // slots they leave (as verl, which drops malformed blocks before it cuts to
  // max_parallel_calls, a malformed block never takes a call's place).
  void KeepBlocks(size_t count);
};

// format: hermes (Qwen2.5's): <tool_call>{"name": ..., "arguments": {...}}</tool_call>, the
// shortest span between the tags, several per response. As verl: a text without both tags has
// no calls and keeps its content whole.
ParsedResponse ParseHermesToolCalls(absl::string_view text);

// verl's tool_response_truncate_side: keep the head ("left"), the tail ("right") or both halves
// ("middle") of a response longer than max_characters (Unicode code points, as Python counts).
// Where Python's slicing would keep everything (n // 2 == 0 for middle, 0 for right) nothing is
// kept; a negative max_characters is no limit (docs/internals/agent.md).
enum class TruncateSide { kLeft, kRight, kMiddle };
absl::StatusOr<TruncateSide> ParseTruncateSide(absl::string_view name);
std::string TruncateToolResponse(absl::string_view text, int64_t max_characters, TruncateSide side);

// What the model reads when a call cannot run (unknown tool, arguments that are not an object,
// a malformed block, a tool that failed): verl's "Error when executing tool: <what>".
std::string ToolErrorObservation(absl::string_view what);

}  // namespace rlhfd::agent
