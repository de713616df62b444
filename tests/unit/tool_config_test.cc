// verl's tool config (worker/agent/tool_config.h) read into rlhfd's tools: verl's sandbox tool
// becomes the local code interpreter with its limits, the configured name and schema are the
// tool's, and every wrong file is refused naming the tool and the key.
#include "worker/agent/tool_config.h"

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "common/util/files.h"
#include "worker/agent/tools.h"

namespace rlhfd::agent {
namespace {

// The shape of verl's examples/sglang_multiturn tool configs (sandbox, then a calculator of
// rlhfd's own under another name).
constexpr char kConfig[] = R"(tools:
  - class_name: "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
    config: {"sandbox_fusion_url": "https://sandbox.example/run_code", "default_timeout": 3,
             "memory_limit_mb": 256, "num_workers": 8, "default_language": "python"}
    tool_schema:
      type: "function"
      function:
        name: "python"
        description: "Runs code."
        parameters: {type: "object", properties: {code: {type: "string"}}, required: ["code"]}
  - class_name: calculator
    tool_schema: {type: function, function: {name: calc, description: "Arithmetic."}}
)";

TEST_CASE("every tool config in configs/tools/ reads", "[tool_config]") {
  absl::StatusOr<std::vector<std::string>> names =
      ListDirectory(std::string(RLHFD_CONFIGS_DIR) + "/tools");
  REQUIRE(names.ok());
  REQUIRE_FALSE(names->empty());
  for (const std::string& name : *names) {
    const std::string path = std::string(RLHFD_CONFIGS_DIR) + "/tools/" + name;
    absl::StatusOr<std::string> text = ReadFileToString(path);
    REQUIRE(text.ok());
    absl::StatusOr<std::vector<ToolSpec>> specs = ReadToolConfig(*text, path);
    INFO(specs.status());
    REQUIRE(specs.ok());
    CHECK_FALSE(specs->empty());
  }
}

TEST_CASE("verl's sandbox tool runs as the local code interpreter, with its limits",
          "[tool_config]") {
  absl::StatusOr<std::vector<ToolSpec>> specs = ReadToolConfig(kConfig, "tools.yaml");
  INFO(specs.status());
  REQUIRE(specs.ok());
  REQUIRE(specs->size() == 2);
  const ToolSpec& code = (*specs)[0];
  CHECK(code.kind == ToolSpec::Kind::kCodeInterpreter);
  CHECK(code.name == "python");
  CHECK(code.limits.wall_time == absl::Seconds(3));
  CHECK(code.limits.cpu_seconds == 3);
  CHECK(code.limits.memory_mb == 256);
  CHECK(code.ignored == std::vector<std::string>{"num_workers", "sandbox_fusion_url"});
  CHECK(code.schema["function"]["parameters"]["required"][0] == "code");
  const ToolSpec& calc = (*specs)[1];
  CHECK(calc.kind == ToolSpec::Kind::kCalculator);
  CHECK(calc.name == "calc");

  // The configured names are the ones the model calls.
  SandboxOptions options;
  options.launcher = RLHFD_SANDBOX_BIN;
  options.limits = code.limits;
  absl::StatusOr<std::unique_ptr<Sandbox>> sandbox = Sandbox::Create(options);
  INFO(sandbox.status());
  REQUIRE(sandbox.ok());
  ToolSet tools;
  for (const ToolSpec& spec : *specs) tools.Add(MakeTool(spec, sandbox->get()));
  CHECK(tools.Call(ToolCall{.name = "python", .arguments = {{"code", "print(2 ** 8)"}}}).text ==
        "256\n");
  CHECK(tools.Call(ToolCall{.name = "calc", .arguments = {{"expression", "2 ** 8"}}}).text ==
        "256");
  CHECK(tools.Call(ToolCall{.name = "code_interpreter", .arguments = {{"code", "1"}}}).error);
  CHECK(tools.Schemas().at(1)["function"]["name"] == "python");
}

TEST_CASE("a wrong tool config is refused naming the tool and the key", "[tool_config]") {
  const std::pair<const char*, const char*> cases[] = {
      {"name: x\n", "a tool config is a mapping with a `tools` list"},
      {"tools: {a: 1}\n", "a tool config is a mapping with a `tools` list"},
      {"tools:\n  - class_name: verl.workers.tool.gsm8k_tool.Gsm8kTool\n"
       "    tool_schema: {function: {name: calc_gsm8k_reward}}\n",
       "tools[0].class_name 'verl.workers.tool.gsm8k_tool.Gsm8kTool' is not a tool rlhfd runs"},
      {"tools:\n  - class_name: calculator\n    tool_schema: {type: function}\n",
       "tools[0].tool_schema.function.name is missing"},
      {"tools:\n  - class_name: calculator\n    tool_schema: {function: {name: c}}\n"
       "  - class_name: calculator\n    tool_schema: {function: {name: c}}\n",
       "tools[1]: a second tool named 'c'"},
      {"tools:\n  - class_name: code_interpreter\n    config: {default_timeout: -1}\n"
       "    tool_schema: {function: {name: c}}\n",
       "tools[0].config.default_timeout must be a positive number up to 86400 (got \"-1\")"},
      // Past a day (1e300 seconds was cast to an integer: undefined), past a TiB.
      {"tools:\n  - class_name: code_interpreter\n    config: {default_timeout: 1e300}\n"
       "    tool_schema: {function: {name: c}}\n",
       "tools[0].config.default_timeout must be a positive number up to 86400"},
      {"tools:\n  - class_name: code_interpreter\n    config: {memory_limit_mb: 1e9}\n"
       "    tool_schema: {function: {name: c}}\n",
       "tools[0].config.memory_limit_mb must be a positive number up to 1048576"},
      {"tools:\n  - class_name: code_interpreter\n    config: {memory_limit_mb: lots}\n"
       "    tool_schema: {function: {name: c}}\n",
       "tools[0].config.memory_limit_mb must be a positive number"},
      {"tools:\n  - class_name: code_interpreter\n    config: {default_language: cpp}\n"
       "    tool_schema: {function: {name: c}}\n",
       "tools[0].config.default_language is \"cpp\": the code interpreter runs python"},
      {"tools: [\n", "t.yaml"},
      // class_name left empty (null), a list, a mapping, or missing: named, not thrown.
      {"tools:\n  - class_name:\n    tool_schema: {function: {name: c}}\n",
       "tools[0].class_name must be the text naming the tool's class"},
      {"tools:\n  - class_name: [calculator]\n    tool_schema: {function: {name: c}}\n",
       "tools[0].class_name must be the text naming the tool's class"},
      {"tools:\n  - {class_name: {calculator: 1}, tool_schema: {function: {name: c}}}\n",
       "tools[0].class_name must be the text naming the tool's class"},
      {"tools:\n  - tool_schema: {function: {name: c}}\n",
       "tools[0].class_name must be the text naming the tool's class"},
  };
  for (const auto& [text, expected] : cases) {
    absl::StatusOr<std::vector<ToolSpec>> specs = ReadToolConfig(text, "t.yaml");
    INFO(text);
    CHECK(specs.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(absl::StrContains(specs.status().message(), expected));
  }
}

TEST_CASE("the prompt lists what verl's schema models keep of a tool schema", "[tool_config]") {
  // The fields in the models' order whatever the file's; the properties in the file's (tags
  // before q); an ordered_json compares its keys' order too.
  const nlohmann::ordered_json schema = nlohmann::ordered_json::parse(R"({
    "x-vendor": 1, "function": {"parameters": {"type": "object", "additionalProperties": false,
        "required": ["q"],
        "properties": {"tags": {"enum": [1, 2], "type": "array", "items": {"type": "string"}},
                       "q": {"description": "query", "type": "string", "minLength": 1}}},
      "description": "Finds.", "name": "search", "examples": ["a"]}, "type": "function"})");
  CHECK(PromptToolSchema(schema) == nlohmann::ordered_json::parse(R"({
    "type": "function",
    "function": {"name": "search", "description": "Finds.",
      "parameters": {"type": "object",
        "properties": {"tags": {"type": "array", "enum": [1, 2]},
                       "q": {"type": "string", "description": "query"}},
        "required": ["q"]}}})"));
  // Read from a tool config, the properties keep the file's order.
  absl::StatusOr<std::vector<ToolSpec>> specs = ReadToolConfig(
      "tools:\n  - class_name: calculator\n    tool_schema:\n      type: function\n"
      "      function:\n        name: calc\n        parameters:\n          type: object\n"
      "          properties: {zeta: {type: string}, alpha: {type: number}}\n",
      "t.yaml");
  REQUIRE(specs.ok());
  CHECK(specs->at(0).prompt_schema ==
        "{\"type\": \"function\", \"function\": {\"name\": \"calc\", \"parameters\": "
        "{\"type\": \"object\", \"properties\": {\"zeta\": {\"type\": \"string\"}, "
        "\"alpha\": {\"type\": \"number\"}}}}}");
}

TEST_CASE("an http tool needs its service's URL; its timeout is read", "[tool_config]") {
  const auto read = [](const std::string& config) {
    return ReadToolConfig(
        "tools:\n  - class_name: http\n    config: " + config +
            "\n    tool_schema: {type: function, function: {name: search, description: d}}\n",
        "tools.yaml");
  };
  auto specs = read("{url: 'http://127.0.0.1:9/x', timeout: 3, retries: 2}");
  REQUIRE(specs.ok());
  CHECK((*specs)[0].kind == ToolSpec::Kind::kHttp);
  CHECK((*specs)[0].url == "http://127.0.0.1:9/x");
  CHECK((*specs)[0].timeout == absl::Seconds(3));
  CHECK((*specs)[0].ignored == std::vector<std::string>{"retries"});
  CHECK_THAT(std::string(read("{timeout: 3}").status().message()),
             Catch::Contains("tools.yaml: tools[0].config.url is missing"));
  CHECK_THAT(
      std::string(read("{url: 'ftp://host/x'}").status().message()),
      Catch::Contains("tools[0].config.url is \"ftp://host/x\": an http:// or https:// URL"));
}

}  // namespace
}  // namespace rlhfd::agent
