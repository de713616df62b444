// A step's metrics in verl's names, from the stages' replies: row lengths, the updates' figures
// renamed, time per token, and the step's own time. The one place these names are made
// (docs/metrics.md lists them).
#pragma once

#include <string>
#include <vector>

#include "controller/driver/pool_calls.h"
#include "rlhfd/v1/worker_service.pb.h"

namespace rlhfd::controller {

// The batch's tokens, as generated.
struct StepTokens {
  double prompt = 0;
  double response = 0;
};

// response_length/*, prompt_length/*, timing_s/update_weights and perf/total_num_tokens of the
// `rows` rows the actor ranks generated; the batch's tokens.
StepTokens AddGenerationMetrics(const std::vector<v1::GenerateReply>& generated, int64_t rows,
                                Metrics& metrics);

// A multi-turn rollout's figures over `samples` responses, from the actor ranks' reply metrics
// (AgentRollout::AddTurnMetrics): <prefix>/num_turns/{mean,min,max} (verl's: training/ for a
// step, val-aux/ for validation), timing_s/agent_loop/tool_calls/mean (verl's: a response's
// tool time, mean), agent/tool_calls/mean and agent/tool_errors/mean (per response). Nothing
// when the replies carry no turns (single-turn jobs).
// How stale a rollout's samples are when step `step` trains them (trainer.mode one_step_off and
// async), in verl's names: updates between the weights each response began with and those the
// step starts from. From the rollout pool's replies in async mode (each token's weights are
// recorded there, with partial rollouts' share and interruptions), else `weights_step`, the
// whole rollout's.
void AddStalenessMetrics(const std::vector<v1::GenerateReply>& generated, int64_t rows,
                         int64_t step, int64_t weights_step, Metrics& metrics);
void AddTurnMetrics(const std::vector<const google::protobuf::Map<std::string, double>*>& replies,
                    double samples, const std::string& prefix, Metrics& metrics);

// actor/* (rank 0's figures), perf/mfu/actor (the ranks' mean) and the ranks' peak memory.
void AddActorUpdateMetrics(const std::vector<v1::UpdateReply>& updated, Metrics& metrics);
// critic/* (rank 0's figures).
void AddCriticUpdateMetrics(const std::vector<v1::UpdateReply>& updated, Metrics& metrics);

// verl's timing_per_token_ms/<stage>: generation per response token, every other stage per
// token of the batch (prompts and responses), for each timed stage.
void AddTimePerToken(const StepTokens& tokens, Metrics& metrics);

// timing_s/step, perf/time_per_step and perf/throughput (tokens a second per rank, from
// perf/total_num_tokens) of a step that took `seconds` on `world_size` ranks.
void RecordStepTime(double seconds, int world_size, Metrics& metrics);

}  // namespace rlhfd::controller
