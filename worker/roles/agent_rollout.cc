#include "worker/roles/agent_rollout.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging/logging.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"
#include "worker/agent/tool_config.h"
#include "worker/roles/prompt_encoding.h"

namespace rlhfd::roles {
namespace {

absl::StatusOr<std::vector<agent::ToolSpec>> ToolSpecs(const v1::JobSpec& spec) {
  const std::string& path = spec.roles().actor().rollout().multi_turn().tool_config_path();
  absl::StatusOr<std::string> text = ReadFileToString(path);
  absl::StatusOr<std::vector<agent::ToolSpec>> specs =
      text.ok() ? agent::ReadToolConfig(*text, path) : text.status();
  if (!specs.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "roles.actor.rollout.multi_turn.tool_config_path: ", specs.status().message()));
  }
  return specs;
}

std::vector<std::string> SchemasOf(const std::vector<agent::ToolSpec>& specs) {
  std::vector<std::string> schemas;
  for (const agent::ToolSpec& tool : specs) {
    schemas.push_back(tool.prompt_schema);
  }
  return schemas;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> PromptTools(const v1::JobSpec& spec) {
  if (!spec.roles().actor().rollout().multi_turn().enable()) return std::vector<std::string>{};
  ASSIGN_OR_RETURN(const std::vector<agent::ToolSpec> specs, ToolSpecs(spec));
  return SchemasOf(specs);
}

absl::StatusOr<std::unique_ptr<AgentRollout>> AgentRollout::Create(
    const v1::JobSpec& spec, const model::Tokenizer& tokenizer) {
  const v1::MultiTurnSpec& turns = spec.roles().actor().rollout().multi_turn();
  if (!turns.enable()) return std::unique_ptr<AgentRollout>();
  ASSIGN_OR_RETURN(const std::vector<agent::ToolSpec> specs, ToolSpecs(spec));
  auto made = std::unique_ptr<AgentRollout>(new AgentRollout());
  for (const agent::ToolSpec& tool : specs) {
    if (!tool.ignored.empty()) {
      RLOG(WARNING) << "multi_turn.tool_config_path: tool '" << tool.name << "': config "
                    << absl::StrJoin(tool.ignored, ", ")
                    << " not read (the code interpreter is a local sandbox; verl's service "
                       "settings such as sandbox_fusion_url, num_workers and rate limits have "
                       "no effect here)";
    }
    agent::Sandbox* sandbox = nullptr;
    if (tool.kind == agent::ToolSpec::Kind::kCodeInterpreter) {
      agent::SandboxOptions options;
      options.limits = tool.limits;
      absl::StatusOr<std::unique_ptr<agent::Sandbox>> created = agent::Sandbox::Create(options);
      if (!created.ok()) {
        return absl::Status(
            created.status().code(),
            absl::StrCat("the code interpreter '", tool.name,
                         "' (multi_turn.tool_config_path): ", created.status().message()));
      }
      sandbox = created->get();
      made->sandboxes_.push_back(*std::move(created));
    }
    made->tools_.Add(agent::MakeTool(tool, sandbox));
  }
  made->prompt_tools_ = SchemasOf(specs);
  agent::MultiTurnOptions options;
  options.max_assistant_turns = turns.max_assistant_turns();
  options.max_user_turns = turns.max_user_turns();
  options.max_parallel_calls = turns.max_parallel_calls();
  options.max_tool_response_length = turns.max_tool_response_length();
  ASSIGN_OR_RETURN(options.truncate_side,
                   agent::ParseTruncateSide(turns.tool_response_truncate_side()));
  options.chat = ChatOptionsOf(spec.data());
  ASSIGN_OR_RETURN(made->loop_, agent::AgentLoop::Create(tokenizer, made->tools_, options));
  return made;
}

absl::StatusOr<std::vector<rollout::GenerationResult>> AgentRollout::Generate(
    HybridEngine& hybrid, const std::vector<rollout::GenerationRequest>& requests, int64_t step) {
  std::vector<int64_t> budgets;
  for (const rollout::GenerationRequest& request : requests) {
    budgets.push_back(request.sampling.max_new_tokens);
  }
  loop_->Begin(std::move(budgets));
  uncounted_turns_.clear();
  absl::StatusOr<std::vector<rollout::GenerationResult>> results =
      hybrid.Generate(requests, step, loop_.get());
  if (!results.ok()) return results;
  for (const rollout::GenerationResult& result : *results) {
    std::vector<int>& uncounted = uncounted_turns_.emplace_back();
    for (const rollout::Completion& sample : result.samples) {
      const bool sampled_last = !sample.response_mask.empty() && sample.response_mask.back() == 1;
      uncounted.push_back(
          sample.finish_reason == rollout::FinishReason::kLength && sampled_last ? 1 : 0);
    }
  }
  return results;
}

void AgentRollout::AddTurnMetrics(std::map<std::string, double>& metrics) const {
  double sum = 0, calls = 0, errors = 0, seconds = 0;
  double fewest = std::numeric_limits<double>::infinity(), most = 0;
  for (size_t request = 0; request < uncounted_turns_.size(); ++request) {
    for (size_t sample = 0; sample < uncounted_turns_[request].size(); ++sample) {
      const agent::SampleTurns turns = loop_->turns(request, static_cast<int64_t>(sample));
      const int64_t assistant_turns = turns.assistant_turns + uncounted_turns_[request][sample];
      const double num_turns = static_cast<double>(assistant_turns + turns.user_turns + 1);
      sum += num_turns;
      fewest = std::min(fewest, num_turns);
      most = std::max(most, num_turns);
      calls += static_cast<double>(turns.tool_calls);
      errors += static_cast<double>(turns.tool_errors);
      seconds += absl::ToDoubleSeconds(turns.tool_time);
    }
  }
  metrics["num_turns_sum"] = sum;
  metrics["num_turns_min"] = std::isfinite(fewest) ? fewest : 0;
  metrics["num_turns_max"] = most;
  metrics["tool_calls"] = calls;
  metrics["tool_errors"] = errors;
  metrics["tool_s"] = seconds;
}

}  // namespace rlhfd::roles
