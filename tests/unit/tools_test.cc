// The tools of a multi-turn rollout (worker/agent/tools.h): the code interpreter through a real
// sandbox and the calculator give the model their output, and every way a call can go wrong
// (unknown tool, arguments of the wrong shape, code that raises or runs too long) is an
// observation marked as an error, never a failure.
#include "worker/agent/tools.h"

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/support/subprocess.h"

namespace rlhfd::agent {
namespace {

ToolCall Call(const std::string& name, nlohmann::json arguments) {
  return ToolCall{.name = name, .arguments = std::move(arguments)};
}

TEST_CASE("the code interpreter runs code in the sandbox and reports how it ended", "[tools]") {
  SandboxOptions options;
  options.launcher = RLHFD_SANDBOX_BIN;
  options.limits.wall_time = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<Sandbox>> sandbox = Sandbox::Create(options);
  INFO(sandbox.status());
  REQUIRE(sandbox.ok());
  ToolSet tools;
  tools.Add(MakeCodeInterpreter(sandbox->get()));
  tools.Add(MakeCalculator());

  ToolObservation printed =
      tools.Call(Call("code_interpreter", {{"code", "print(sum(range(10)))"}}));
  CHECK(printed.text == "45\n");
  CHECK_FALSE(printed.error);

  ToolObservation raised = tools.Call(Call("code_interpreter", {{"code", "print('a')\n1/0"}}));
  CHECK(absl::StartsWith(raised.text, "a\nTraceback"));
  CHECK(absl::StrContains(raised.text, "ZeroDivisionError: division by zero"));
  CHECK(raised.error);

  ToolObservation slept =
      tools.Call(Call("code_interpreter", {{"code", "import time\ntime.sleep(30)"}}));
  CHECK(absl::StrContains(slept.text, "[stopped: over the time limit of"));
  CHECK(slept.error);

  ToolObservation wrong = tools.Call(Call("code_interpreter", {{"source", "print(1)"}}));
  CHECK(wrong.text ==
        "Error when executing tool: the arguments need \"code\" as a string: "
        "{\"source\":\"print(1)\"}");
  CHECK(wrong.error);
  wrong = tools.Call(Call("code_interpreter", "print(1)"));
  CHECK(wrong.text ==
        "Error when executing tool: the arguments are not a JSON object: \"print(1)\"");

  const ToolObservation unknown = tools.Call(Call("search", nlohmann::json::object()));
  CHECK(unknown.text ==
        "Error when executing tool: \"Tool 'search' not found. Available tools: "
        "['calculator', 'code_interpreter']\"");
  CHECK(unknown.error);
  CHECK(tools.Schemas().size() == 2);
}

TEST_CASE("the calculator evaluates Python arithmetic without running anything", "[tools]") {
  ToolSet tools;
  tools.Add(MakeCalculator());
  CHECK(tools.Call(Call("calculator", {{"expression", "2 + 3 * 4"}})).text == "14");
  CHECK(tools.Call(Call("calculator", {{"expression", "7 / 2"}})).text == "3.5");
  CHECK(tools.Call(Call("calculator", {{"expression", "2 ** 10 // 3"}})).text == "341");
  CHECK(tools.Call(Call("calculator", {{"expression", "0.1 + 0.2"}})).text ==
        "0.30000000000000004");
  const ToolObservation bad = tools.Call(Call("calculator", {{"expression", "1 / 0"}}));
  CHECK(bad.text == "Error when executing tool: cannot evaluate '1 / 0'");
  CHECK(bad.error);
  CHECK(tools.Call(Call("calculator", {{"expression", "__import__('os')"}})).error);
  const std::vector<nlohmann::json> schemas = tools.Schemas();
  REQUIRE(schemas.size() == 1);
  const nlohmann::json& schema = schemas[0];
  CHECK(schema["function"]["name"] == "calculator");
  CHECK(schema["function"]["parameters"]["required"] == nlohmann::json{"expression"});
}

TEST_CASE("the HTTP tool posts its calls to the user's service; failures are observations",
          "[tools]") {
  testing::TempDir dir;
  const int port = testing::FreeLoopbackPort();
  testing::Subprocess server(
      {RLHFD_PYTHON, std::string(RLHFD_SOURCE_DIR) + "/tests/agent/tool_server.py",
       std::to_string(port)},
      dir.path() + "/server.log");
  REQUIRE(testing::WaitFor([&] { return server.ReadLog().find("serving") != std::string::npos; },
                           absl::Seconds(20)));
  const std::string url = absl::StrCat("http://127.0.0.1:", port, "/call");
  ToolSet tools;
  tools.Add(MakeHttpTool("search", nlohmann::json::object(), url, absl::Seconds(2)));

  ToolObservation echoed = tools.Call(Call("search", {{"mode", "echo"}, {"query", "naïve 😀"}}));
  CHECK(echoed.text ==
        "{\"arguments\": {\"mode\": \"echo\", \"query\": \"naïve 😀\"}, \"name\": \"search\"}");
  CHECK_FALSE(echoed.error);

  const ToolObservation slow = tools.Call(Call("search", {{"mode", "slow"}}));
  CHECK(slow.error);
  CHECK(absl::StrContains(slow.text, "the search service: no complete answer within 2s"));
  CHECK(slow.time < absl::Seconds(4));

  const ToolObservation failed = tools.Call(Call("search", {{"mode", "fail"}}));
  CHECK(failed.error);
  CHECK(absl::StrContains(failed.text, "HTTP 500: internal trouble"));

  const ToolObservation big = tools.Call(Call("search", {{"mode", "big"}}));
  CHECK(big.error);
  CHECK(absl::StrContains(big.text, "the reply is longer than 1048576 bytes"));

  const ToolObservation not_object = tools.Call(Call("search", "text"));
  CHECK(not_object.error);

  // Nothing listening: an observation, not a failure.
  ToolSet gone;
  gone.Add(MakeHttpTool("search", nlohmann::json::object(),
                        absl::StrCat("http://127.0.0.1:", testing::FreeLoopbackPort(), "/"),
                        absl::Seconds(2)));
  const ToolObservation refused = gone.Call(Call("search", {{"mode", "echo"}}));
  CHECK(refused.error);
  CHECK(absl::StartsWith(refused.text, "Error when executing tool: the search service: "));
}

}  // namespace
}  // namespace rlhfd::agent
