// verl's tool config (multi_turn.tool_config_path): the tools a multi-turn job may call, read
// into what rlhfd runs. The file, as verl's examples write it:
//   tools:
//     - class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool
//       config: {default_timeout: 30, memory_limit_mb: 1024, ...}
//       tool_schema: {type: function, function: {name: code_interpreter, parameters: ...}}
// A tool's name is its schema's function name, as in verl. verl's SandboxFusionTool (a remote
// sandbox service) runs here as the local code interpreter (sandbox.h), with its timeout and
// memory limit; `calculator` and `http` (a service the user runs: config {url, timeout}) are
// rlhfd's own. Other classes are refused by name, since their code (Python) is not something
// this worker runs.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "worker/agent/sandbox.h"

namespace rlhfd::agent {

struct ToolSpec {
  enum class Kind { kCodeInterpreter, kCalculator, kHttp };
  Kind kind;
  std::string name;       // tool_schema.function.name
  nlohmann::json schema;  // tool_schema as the file gives it
  std::string prompt_schema;  // PromptToolSchemaText of it, in the file's key order
  SandboxLimits limits;   // kCodeInterpreter: default_timeout, memory_limit_mb
  std::string url;        // kHttp: config.url, the service the calls go to
  absl::Duration timeout = absl::Seconds(30);  // kHttp: config.timeout (seconds)
  // config keys read but not honoured here (sandbox_fusion_url: the sandbox is local); the
  // worker's log names them when the job's rollout is made.
  std::vector<std::string> ignored;
};

// A tool's schema as the prompt lists it: what verl's pydantic schema models keep of the file's
// tool_schema (OpenAIFunctionToolSchema, dumped with exclude_unset), in their fields' order: type
// and function; the function's name, description, parameters and strict; the parameters' type,
// properties (in the file's order) and required; each property's type, description and enum.
// Other keys (a property's `items`, say) are dropped, as verl drops them.
nlohmann::ordered_json PromptToolSchema(const nlohmann::ordered_json& schema);

// PromptToolSchema(schema) as the chat template's `tojson` prints it (PythonJsonDumps).
std::string PromptToolSchemaText(const nlohmann::ordered_json& schema);

// INVALID_ARGUMENT naming the file, the tool's index and the key for anything wrong: not a
// mapping with a `tools` list, an unknown class, a schema without a function name, two tools of
// one name, a limit that is not a positive number, a language other than python.
absl::StatusOr<std::vector<ToolSpec>> ReadToolConfig(absl::string_view text,
                                                     absl::string_view source);

}  // namespace rlhfd::agent
