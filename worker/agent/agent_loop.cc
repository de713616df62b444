#include "worker/agent/agent_loop.h"

#include <algorithm>
#include <exception>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/util/text.h"

namespace rlhfd::agent {
namespace {

// Invalid UTF-8 (output cut mid-character, binary printed by the code) as U+FFFD each byte, so
// that the tokenizer, which takes UTF-8 only, can read any tool output.
std::string ReplaceInvalidUtf8(absl::string_view text) {
  std::string out;
  while (!text.empty()) {
    const size_t bad = FirstInvalidUtf8(text);
    if (bad == absl::string_view::npos) {
      absl::StrAppend(&out, text);
      break;
    }
    absl::StrAppend(&out, text.substr(0, bad));
    out += "\xEF\xBF\xBD";
    text.remove_prefix(bad + 1);
  }
  return out;
}

std::future<rollout::TurnOutcome> Finished() {
  std::promise<rollout::TurnOutcome> outcome;
  outcome.set_value(rollout::TurnOutcome{});
  return outcome.get_future();
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> ToolTurnTokens(const model::Tokenizer& tokenizer,
                                                    absl::Span<const std::string> responses,
                                                    bool after_turn_end,
                                                    const model::ChatOptions& chat) {
  absl::StatusOr<std::string> turn = tokenizer.ApplyChatTemplateToolResponses(responses, chat);
  if (!turn.ok()) return turn.status();
  return tokenizer.Encode(absl::StrCat(after_turn_end ? "\n" : "", *turn));
}

absl::StatusOr<std::unique_ptr<AgentLoop>> AgentLoop::Create(const model::Tokenizer& tokenizer,
                                                             ToolSet& tools,
                                                             MultiTurnOptions options) {
  if (tokenizer.chat_template() != model::ChatTemplate::kChatMl) {
    return absl::InvalidArgumentError(
        "multi_turn (format hermes) needs a ChatML chat template (Qwen2.5, Qwen3): its tool "
        "calls and tool responses are ChatML turns; this model's template is another");
  }
  if (options.max_parallel_calls < 1) {
    return absl::InvalidArgumentError("multi_turn.max_parallel_calls must be at least 1");
  }
  if (options.max_assistant_turns < 0 || options.max_user_turns < 0) {
    return absl::InvalidArgumentError(
        "multi_turn.max_assistant_turns and max_user_turns must be >= 0 (0: no limit)");
  }
  if (options.tool_threads < 1) {
    return absl::InvalidArgumentError("multi_turn tool threads must be at least 1");
  }
  auto loop = std::unique_ptr<AgentLoop>(new AgentLoop(tokenizer, tools, options));
  loop->turn_end_id_ = tokenizer.TokenToId("<|im_end|>");
  for (int i = 0; i < options.tool_threads; ++i) {
    loop->threads_.emplace_back([raw = loop.get()] { raw->Work(); });
  }
  return loop;
}

AgentLoop::AgentLoop(const model::Tokenizer& tokenizer, ToolSet& tools, MultiTurnOptions options)
    : tokenizer_(tokenizer), tools_(tools), options_(options) {}

AgentLoop::~AgentLoop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_ready_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void AgentLoop::Work() {
  while (true) {
    std::packaged_task<rollout::TurnOutcome()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      // The queue is run to its end before stopping: each task's future is waited on.
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();  // NextTurn catches what it can; a throw reaches the future, never this thread
  }
}

void AgentLoop::Begin(std::vector<int64_t> budgets) {
  std::lock_guard<std::mutex> lock(mutex_);
  budgets_ = std::move(budgets);
  turns_.clear();
}

SampleTurns AgentLoop::turns(size_t request, int64_t sample) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = turns_.find({request, sample});
  return found == turns_.end() ? SampleTurns{} : found->second;
}

std::future<rollout::TurnOutcome> AgentLoop::OnStop(size_t request, int64_t sample,
                                                    const rollout::Completion& completion) {
  const std::pair<size_t, int64_t> key = {request, sample};
  const int64_t length = static_cast<int64_t>(completion.token_ids.size());
  int64_t budget = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    SampleTurns& turns = turns_[key];
    turns.assistant_turns += 1;
    budget = request < budgets_.size() ? budgets_[request] : 0;
    if (length >= budget) return Finished();
    if (options_.max_assistant_turns > 0 && turns.assistant_turns >= options_.max_assistant_turns) {
      return Finished();
    }
    if (options_.max_user_turns > 0 && turns.user_turns >= options_.max_user_turns) {
      return Finished();
    }
  }
  // This turn: the tokens after the last inserted one.
  size_t begin = completion.response_mask.size();
  while (begin > 0 && completion.response_mask[begin - 1] != 0) --begin;
  const std::vector<int32_t> ids(completion.token_ids.begin() + static_cast<ptrdiff_t>(begin),
                                 completion.token_ids.end());
  ParsedResponse parsed = ParseHermesToolCalls(tokenizer_.Decode(ids));
  if (parsed.calls.empty() && parsed.malformed.empty()) return Finished();
  parsed.KeepBlocks(static_cast<size_t>(options_.max_parallel_calls));
  const bool after_turn_end = completion.token_ids.back() == turn_end_id_;
  std::packaged_task<rollout::TurnOutcome()> task(
      [this, key, calls = std::move(parsed.calls), malformed = std::move(parsed.malformed),
       after_turn_end, room = budget - length]() mutable {
        return NextTurn(key, std::move(calls), std::move(malformed), after_turn_end, room);
      });
  std::future<rollout::TurnOutcome> outcome = task.get_future();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  work_ready_.notify_one();
  return outcome;
}

rollout::TurnOutcome AgentLoop::NextTurn(std::pair<size_t, int64_t> key,
                                         std::vector<ToolCall> calls,
                                         std::vector<MalformedToolCall> malformed,
                                         bool after_turn_end, int64_t room) {
  const absl::Time start = absl::Now();
  // The responses in the order the blocks were written: they carry no call id, so a malformed
  // block's error out of place would read as another call's result.
  std::vector<std::string> responses;
  int64_t errors = 0;
  size_t next_call = 0, next_malformed = 0;
  while (next_call < calls.size() || next_malformed < malformed.size()) {
    if (next_malformed < malformed.size() &&
        (next_call == calls.size() || malformed[next_malformed].block < calls[next_call].block)) {
      errors += 1;
      responses.push_back(ToolErrorObservation(malformed[next_malformed++].error));
      continue;
    }
    ToolObservation observation;
    try {
      observation = tools_.Call(calls[next_call++]);
    } catch (const std::exception& error) {
      observation = {.text = ToolErrorObservation(error.what()), .error = true};
    }
    errors += observation.error ? 1 : 0;
    responses.push_back(TruncateToolResponse(ReplaceInvalidUtf8(observation.text),
                                             options_.max_tool_response_length,
                                             options_.truncate_side));
  }
  const absl::Duration took = absl::Now() - start;
  rollout::TurnOutcome outcome;  // finish, unless the tool turn fits
  const absl::StatusOr<std::vector<int32_t>> ids =
      ToolTurnTokens(tokenizer_, responses, after_turn_end, options_.chat);
  if (ids.ok() && static_cast<int64_t>(ids->size()) < room) {
    outcome = {.finish = false, .inserted = {ids->begin(), ids->end()}};
  }
  std::lock_guard<std::mutex> lock(mutex_);
  SampleTurns& turns = turns_[key];
  turns.tool_calls += static_cast<int64_t>(calls.size() + malformed.size());
  turns.tool_errors += errors;
  turns.tool_time += took;
  if (!outcome.finish) turns.user_turns += 1;
  return outcome;
}

}  // namespace rlhfd::agent
