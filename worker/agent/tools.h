// The tools a multi-turn rollout can call, and the text each call gives back to the model. A
// call never fails the rollout: what goes wrong (an unknown tool, arguments of the wrong shape,
// code that raised or ran out of time) is the observation, as in verl's ToolAgentLoop.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "worker/agent/sandbox.h"
#include "worker/agent/tool_calls.h"
#include "worker/agent/tool_config.h"

namespace rlhfd::agent {

// What one call gave.
struct ToolObservation {
  std::string text;    // for the model, before truncation
  bool error = false;  // counted as a tool error (verl's metric)
  absl::Duration time;
};

class Tool {
 public:
  Tool(std::string name, nlohmann::json schema)
      : name_(std::move(name)), schema_(std::move(schema)) {}
  virtual ~Tool() = default;
  const std::string& name() const { return name_; }
  // The OpenAI function schema the chat template lists.
  const nlohmann::json& schema() const { return schema_; }
  virtual ToolObservation Call(const nlohmann::json& arguments) = 0;

 private:
  std::string name_;
  nlohmann::json schema_;
};

// code_interpreter {"code": str}: runs the code in `sandbox` (not owned); the observation is its
// stdout and stderr, with a last line saying so where it was stopped or failed.
std::unique_ptr<Tool> MakeCodeInterpreter(Sandbox* sandbox);
// calculator {"expression": str}: Python arithmetic (+ - * / // ** and parentheses), evaluated
// without running anything; the value in the shortest form that reads back exactly ("14",
// "3.5"; a whole number without ".0", whether Python would have made an int or a float).
std::unique_ptr<Tool> MakeCalculator();

// An HTTP service the user runs: each call POSTs {"name": <tool name>, "arguments": {...}} as
// JSON to `url`; the observation is the reply's body (UTF-8 text) on HTTP 200. No answer within
// `timeout`, a refused connection, another status or a reply over 1 MiB is an error observation
// naming what happened; nothing is retried (the model sees the failure, as with any tool).
std::unique_ptr<Tool> MakeHttpTool(std::string name, nlohmann::json schema, std::string url,
                                   absl::Duration timeout);

// A tool config entry's tool (tool_config.h), under its configured name and schema; a code
// interpreter runs in `sandbox` (made with spec.limits by the caller; not owned).
std::unique_ptr<Tool> MakeTool(const ToolSpec& spec, Sandbox* sandbox);

// The job's tools by name.
class ToolSet {
 public:
  void Add(std::unique_ptr<Tool> tool);
  // verl's message for a name it does not have, or the tool's observation.
  ToolObservation Call(const ToolCall& call);
  std::vector<nlohmann::json> Schemas() const;

 private:
  std::map<std::string, std::unique_ptr<Tool>> tools_;
};

}  // namespace rlhfd::agent
