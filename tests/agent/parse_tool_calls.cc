// For tests/agent/verl_tool_parser_parity.py: reads JSON lines {"text": ...} on stdin and writes,
// per line, what ParseHermesToolCalls makes of the text:
// {"content": ..., "calls": [{"name": ..., "arguments": ...}], "malformed": count}.
#include <iostream>
#include <string>

#include "nlohmann/json.hpp"
#include "worker/agent/tool_calls.h"

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    const nlohmann::json input = nlohmann::json::parse(line);
    const rlhfd::agent::ParsedResponse parsed =
        rlhfd::agent::ParseHermesToolCalls(input.at("text").get<std::string>());
    nlohmann::json calls = nlohmann::json::array();
    for (const rlhfd::agent::ToolCall& call : parsed.calls) {
      calls.push_back({{"name", call.name}, {"arguments", call.arguments}});
    }
    std::cout << nlohmann::json{{"content", parsed.content},
                                {"calls", calls},
                                {"malformed", parsed.malformed.size()}}
                     .dump()
              << "\n";
  }
  return 0;
}
