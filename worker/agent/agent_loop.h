// The multi-turn rollout's turn handler, as verl's ToolAgentLoop: when a sample stops, its last
// turn is read for hermes tool calls; the calls run on a pool of tool threads while the engine
// decodes the others; their responses go back to the model as the chat template's tool turn, and
// the sample goes on. A sample ends when its turn calls no tool, at max_assistant_turns or
// max_user_turns, or when the tool turn would reach the response budget (verl terminates there
// too, without appending it).
//
// Tool responses are cut to max_tool_response_length (verl's truncate side); a malformed call
// block is answered with verl's error observation (verl drops the block silently; the issue asks
// that the model be told). Of a turn's blocks, max_parallel_calls are answered: the first
// well-formed calls, malformed ones in the slots left; each in the order written (the responses
// carry no call id).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/agent/tool_calls.h"
#include "worker/agent/tools.h"
#include "worker/model/tokenizer.h"
#include "worker/rollout/request.h"

namespace rlhfd::agent {

// The tokens that give `responses` back to the model: the chat template's tool turn up to the
// next model turn, after the template's newline when the model's turn ended with <|im_end|>
// (`after_turn_end`), as verl's Qwen builder inserts them; its generation prompt as `chat` says.
absl::StatusOr<std::vector<int32_t>> ToolTurnTokens(const model::Tokenizer& tokenizer,
                                                    absl::Span<const std::string> responses,
                                                    bool after_turn_end,
                                                    const model::ChatOptions& chat = {});

// roles.actor.rollout.multi_turn, with verl's defaults.
struct MultiTurnOptions {
  int64_t max_assistant_turns = 0;  // 0: no limit (verl's null)
  int64_t max_user_turns = 0;       // 0: no limit
  int64_t max_parallel_calls = 1;
  int64_t max_tool_response_length = 256;  // code points
  TruncateSide truncate_side = TruncateSide::kMiddle;
  int tool_threads = 8;  // calls running at once, over every sample
  model::ChatOptions chat;  // the job's (data.enable_thinking), for each tool turn's prompt
};

// One sample's turns (verl's num_turns is assistant + user turns + 1).
struct SampleTurns {
  int64_t assistant_turns = 0;
  int64_t user_turns = 0;  // tool turns given back
  int64_t tool_calls = 0;  // blocks answered, malformed ones included
  int64_t tool_errors = 0;
  absl::Duration tool_time;  // the sample's calls, end to end
};

class AgentLoop : public rollout::TurnHandler {
 public:
  // INVALID_ARGUMENT for a tokenizer whose chat template has no tool turn (ChatML only) or
  // options out of range. `tokenizer` and `tools` must outlive the loop.
  static absl::StatusOr<std::unique_ptr<AgentLoop>> Create(const model::Tokenizer& tokenizer,
                                                           ToolSet& tools,
                                                           MultiTurnOptions options);
  // Waits for the calls still running.
  ~AgentLoop() override;

  // Before each Generate: each request's max_new_tokens (the budget of sampled and inserted
  // tokens together); forgets the last call's turns.
  void Begin(std::vector<int64_t> budgets);

  std::future<rollout::TurnOutcome> OnStop(size_t request, int64_t sample,
                                           const rollout::Completion& completion) override;

  // After Generate: what each sample's turns came to.
  SampleTurns turns(size_t request, int64_t sample) const;

 private:
  AgentLoop(const model::Tokenizer& tokenizer, ToolSet& tools, MultiTurnOptions options);
  // The tool turn after a stop: runs `calls` and `malformed`, renders and encodes the
  // responses; finish when they would reach `room` tokens.
  rollout::TurnOutcome NextTurn(std::pair<size_t, int64_t> key, std::vector<ToolCall> calls,
                                std::vector<MalformedToolCall> malformed, bool after_turn_end,
                                int64_t room);
  void Work();  // a tool thread

  const model::Tokenizer& tokenizer_;
  ToolSet& tools_;
  MultiTurnOptions options_;
  int32_t turn_end_id_ = -1;  // <|im_end|>

  mutable std::mutex mutex_;
  std::vector<int64_t> budgets_;
  std::map<std::pair<size_t, int64_t>, SampleTurns> turns_;
  std::deque<std::packaged_task<rollout::TurnOutcome()>> queue_;
  std::condition_variable work_ready_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace rlhfd::agent
