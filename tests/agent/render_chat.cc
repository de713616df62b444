// For verl_chat_parity.py: a model's prompts with tools and its tool turns as rlhfd makes them.
// Reads {"model": DIR, "cases": [{"messages": [{"role", "content"}...], "tools": [schema...],
// "tool_responses": [text...], "after_turn_end": bool}...]} on stdin; writes one JSON line per
// case: {"prompt": text, "prompt_ids": [...], "tool_turn_ids": [...]}. Exit 1 with the error.
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "worker/agent/agent_loop.h"
#include "worker/agent/tool_config.h"
#include "worker/model/tokenizer.h"

int main() {
  using rlhfd::model::Tokenizer;
  const std::string input((std::istreambuf_iterator<char>(std::cin)),
                          std::istreambuf_iterator<char>());
  // In the text's key order: the schemas' properties are printed in it.
  const nlohmann::ordered_json request = nlohmann::ordered_json::parse(input);
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(request.at("model").get<std::string>());
  if (!tokenizer.ok()) {
    std::cerr << tokenizer.status() << "\n";
    return 1;
  }
  for (const nlohmann::ordered_json& item : request.at("cases")) {
    std::vector<rlhfd::model::ChatMessage> messages;
    for (const nlohmann::ordered_json& message : item.at("messages")) {
      messages.push_back({message.at("role"), message.at("content")});
    }
    std::vector<std::string> tools;
    for (const nlohmann::ordered_json& schema : item.at("tools")) {
      tools.push_back(rlhfd::agent::PromptToolSchemaText(schema));
    }
    const absl::StatusOr<std::string> prompt =
        tokenizer->ApplyChatTemplate(messages, /*add_generation_prompt=*/true, tools);
    if (!prompt.ok()) {
      std::cerr << prompt.status() << "\n";
      return 1;
    }
    const absl::StatusOr<std::vector<int32_t>> prompt_ids = tokenizer->Encode(*prompt);
    const std::vector<std::string> responses = item.at("tool_responses");
    const absl::StatusOr<std::vector<int32_t>> turn_ids =
        rlhfd::agent::ToolTurnTokens(*tokenizer, responses, item.at("after_turn_end").get<bool>());
    if (!prompt_ids.ok() || !turn_ids.ok()) {
      std::cerr << (prompt_ids.ok() ? turn_ids.status() : prompt_ids.status()) << "\n";
      return 1;
    }
    std::cout << nlohmann::json{{"prompt", *prompt},
                                {"prompt_ids", *prompt_ids},
                                {"tool_turn_ids", *turn_ids}}
                     .dump()
              << "\n";
  }
  return 0;
}
