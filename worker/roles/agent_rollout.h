// An actor's multi-turn rollouts (roles.actor.rollout.multi_turn): the tool config's tools, each
// code interpreter with a sandbox of its own limits; the agent loop that runs them between
// turns; the tools' schemas as the prompt lists them; and what the samples' turns came to, as
// the step's metrics.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "worker/agent/agent_loop.h"
#include "worker/agent/sandbox.h"
#include "worker/agent/tools.h"
#include "worker/model/tokenizer.h"
#include "worker/roles/hybrid_engine.h"

namespace rlhfd::roles {

// The tools' schemas as a prompt lists them (json.dumps of each, in the tool config's order);
// none when multi_turn is off. INVALID_ARGUMENT naming the file for a bad tool config.
absl::StatusOr<std::vector<std::string>> PromptTools(const v1::JobSpec& spec);

class AgentRollout {
 public:
  // Null when multi_turn is off. `tokenizer` must outlive it.
  static absl::StatusOr<std::unique_ptr<AgentRollout>> Create(const v1::JobSpec& spec,
                                                              const model::Tokenizer& tokenizer);

  const std::vector<std::string>& prompt_tools() const { return prompt_tools_; }

  // `requests` through `hybrid` with the agent loop between turns.
  absl::StatusOr<std::vector<rollout::GenerationResult>> Generate(
      HybridEngine& hybrid, const std::vector<rollout::GenerationRequest>& requests, int64_t step);

  // The last Generate's turns, summed over its samples, for a reply's metrics (the driver makes
  // verl's names of them): num_turns_sum / _min / _max (verl's num_turns: assistant + tool
  // turns + 1), tool_calls, tool_errors, tool_s (the samples' tool time, summed).
  void AddTurnMetrics(std::map<std::string, double>& metrics) const;

 private:
  AgentRollout() = default;

  std::vector<std::unique_ptr<agent::Sandbox>> sandboxes_;
  agent::ToolSet tools_;
  std::vector<std::string> prompt_tools_;
  std::unique_ptr<agent::AgentLoop> loop_;
  // Of the last Generate, per request and sample: 1 where the sample's last turn ended at the
  // length limit, which the loop never hears of (it is told of stops), else 0.
  std::vector<std::vector<int>> uncounted_turns_;
};

}  // namespace rlhfd::roles
