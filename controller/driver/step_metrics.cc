#include "controller/driver/step_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace rlhfd::controller {
namespace {

// verl's names for the update metrics.
const std::map<std::string, std::string>& ActorMetricNames() {
  static const auto* names =
      new std::map<std::string, std::string>{{"policy_loss", "actor/pg_loss"},
                                             {"kl_loss", "actor/kl_loss"},
                                             {"sft_loss", "train/loss"},  // verl's SFT trainer's
                                             {"clip_fraction", "actor/pg_clipfrac"},
                                             {"clip_fraction_low", "actor/pg_clipfrac_lower"},
                                             {"approx_kl", "actor/ppo_kl"},
                                             {"entropy", "actor/entropy"},
                                             {"grad_norm", "actor/grad_norm"},
                                             {"lr", "actor/lr"},
                                             {"nonfinite_skips", "actor/nonfinite_skips"},
                                             {"response_tokens_per_s", "actor/tokens_per_s"}};
  return *names;
}

const std::map<std::string, std::string>& CriticMetricNames() {
  static const auto* names =
      new std::map<std::string, std::string>{{"value_loss", "critic/vf_loss"},
                                             {"value_clip_fraction", "critic/vf_clipfrac"},
                                             {"values", "critic/vpred_mean"},
                                             {"explained_variance", "critic/vf_explained_var"},
                                             {"grad_norm", "critic/grad_norm"},
                                             {"lr", "critic/lr"},
                                             {"nonfinite_skips", "critic/nonfinite_skips"}};
  return *names;
}

void AddRenamed(const google::protobuf::Map<std::string, double>& from,
                const std::map<std::string, std::string>& names, Metrics& to) {
  for (const auto& [name, value] : from) {
    const auto renamed = names.find(name);
    if (renamed != names.end()) to[renamed->second] = value;
  }
}

// The largest of the replies' `name` metric; none when no reply has it (a GPU-only figure on
// CPU workers).
template <typename Reply>
std::optional<double> Largest(const std::vector<Reply>& replies, const std::string& name) {
  std::optional<double> largest;
  for (const Reply& reply : replies) {
    const auto found = reply.metrics().find(name);
    if (found != reply.metrics().end())
      largest = std::max(largest.value_or(found->second), found->second);
  }
  return largest;
}

// A slow host among the rollout's ranks: each rank's own tokens per second (its response tokens
// over its rollout_s, which leaves out the waits in collectives that make every rank's
// generate_s the slowest's), the slowest against the median. Needs two ranks or more.
void AddStragglerMetrics(const std::vector<v1::GenerateReply>& generated, Metrics& metrics) {
  std::vector<std::pair<double, size_t>> rates;  // (tokens per second, position)
  for (size_t i = 0; i < generated.size(); ++i) {
    const auto& reply = generated[i].metrics();
    const auto seconds = reply.find("rollout_s");
    const auto tokens = reply.find("response_tokens");
    if (seconds == reply.end() || tokens == reply.end()) return;
    const double rate = tokens->second / std::max(seconds->second, 1e-9);
    // A figure that is not a number would break the sort's ordering (undefined behaviour).
    if (!std::isfinite(rate)) return;
    rates.emplace_back(rate, i);
  }
  if (rates.size() < 2) return;
  std::sort(rates.begin(), rates.end());
  const double median = rates[rates.size() / 2].first;
  metrics["perf/straggler/gen/rank"] = static_cast<double>(rates.front().second);
  metrics["perf/straggler/gen/ratio"] = median / std::max(rates.front().first, 1e-9);
}

}  // namespace

void AddStalenessMetrics(const std::vector<v1::GenerateReply>& generated, int64_t rows,
                         int64_t step, int64_t weights_step, Metrics& metrics) {
  const double trained_from = static_cast<double>(step - 1);
  double oldest_sum = 0, oldest_least = static_cast<double>(weights_step), partial = 0;
  const bool per_response = Largest(generated, "oldest_weights_step_min").has_value();
  if (per_response) {
    oldest_least = std::numeric_limits<double>::infinity();
    for (const v1::GenerateReply& reply : generated) {
      const auto& figures = reply.metrics();
      const auto figure = [&figures](const char* name, double otherwise) {
        const auto found = figures.find(name);
        return found == figures.end() ? otherwise : found->second;
      };
      oldest_sum += figure("oldest_weights_step_sum", 0);
      oldest_least = std::min(oldest_least, figure("oldest_weights_step_min", oldest_least));
      partial += figure("partial_responses", 0);
    }
  } else {
    oldest_sum = static_cast<double>(weights_step) * static_cast<double>(rows);
  }
  const double all_rows = static_cast<double>(std::max<int64_t>(rows, 1));
  metrics["training/off_policy/trajectory_staleness/mean"] = trained_from - oldest_sum / all_rows;
  metrics["training/off_policy/trajectory_staleness/max"] = trained_from - oldest_least;
  if (per_response) {
    metrics["training/off_policy/partial_rollout_ratio"] = partial / all_rows;
    metrics["training/off_policy/rollout_interruptions"] =
        Largest(generated, "interruptions").value_or(0.0);
  }
}

StepTokens AddGenerationMetrics(const std::vector<v1::GenerateReply>& generated, int64_t rows,
                                Metrics& metrics) {
  // Bringing the rollout's weights up to date is part of generating; verl times it apart.
  metrics["timing_s/update_weights"] = Largest(generated, "update_weights_s").value_or(0.0);
  for (const char* name : {"reshard_buffer_bytes", "reshard_received_bytes", "preemptions"}) {
    if (const std::optional<double> bytes = Largest(generated, name)) {
      metrics[absl::StrCat("perf/rollout_", name)] = *bytes;
    }
  }
  // trainer.verify_weight_sync: present on the steps checked (a failed check fails the step).
  if (const std::optional<double> checked = Largest(generated, "weight_sync_check_s")) {
    metrics["timing_s/verify_weight_sync"] = *checked;
    metrics["actor/weight_sync_ok"] = Largest(generated, "weight_sync_ok").value_or(0.0);
    metrics["actor/rollout_weights_checksum"] =
        Largest(generated, "rollout_weights_checksum").value_or(0.0);
  }
  AddStragglerMetrics(generated, metrics);
  StepTokens tokens;
  double longest = 0, shortest = 1e18, truncated = 0;
  double longest_prompt = 0, shortest_prompt = 1e18;
  for (const v1::GenerateReply& reply : generated) {
    for (const v1::RowInfo& row : reply.rows()) {
      longest_prompt = std::max<double>(longest_prompt, row.prompt_tokens());
      shortest_prompt = std::min<double>(shortest_prompt, row.prompt_tokens());
      tokens.response += row.response_tokens();
      tokens.prompt += row.prompt_tokens();
      longest = std::max<double>(longest, row.response_tokens());
      shortest = std::min<double>(shortest, row.response_tokens());
      truncated += row.truncated() ? 1 : 0;
    }
  }
  const double all_rows = static_cast<double>(rows);
  metrics["response_length/mean"] = tokens.response / all_rows;
  metrics["response_length/max"] = longest;
  metrics["response_length/min"] = shortest;
  metrics["response_length/clip_ratio"] = truncated / all_rows;
  metrics["prompt_length/mean"] = tokens.prompt / all_rows;
  metrics["prompt_length/max"] = longest_prompt;
  metrics["prompt_length/min"] = shortest_prompt;
  metrics["perf/total_num_tokens"] = tokens.response + tokens.prompt;
  std::vector<const google::protobuf::Map<std::string, double>*> turns;
  for (const v1::GenerateReply& reply : generated) turns.push_back(&reply.metrics());
  AddTurnMetrics(turns, all_rows, "training", metrics);
  return tokens;
}

void AddTurnMetrics(const std::vector<const google::protobuf::Map<std::string, double>*>& replies,
                    double samples, const std::string& prefix, Metrics& metrics) {
  double turns = 0, calls = 0, errors = 0, seconds = 0, fewest = 1e18, most = 0;
  bool any = false;
  for (const auto* reply : replies) {
    const auto sum = reply->find("num_turns_sum");
    if (sum == reply->end()) continue;
    any = true;
    turns += sum->second;
    const auto value = [reply](const char* name) {
      const auto found = reply->find(name);
      return found == reply->end() ? 0.0 : found->second;
    };
    fewest = std::min(fewest, value("num_turns_min"));
    most = std::max(most, value("num_turns_max"));
    calls += value("tool_calls");
    errors += value("tool_errors");
    seconds += value("tool_s");
  }
  if (!any || samples <= 0) return;
  metrics[absl::StrCat(prefix, "/num_turns/mean")] = turns / samples;
  metrics[absl::StrCat(prefix, "/num_turns/min")] = fewest;
  metrics[absl::StrCat(prefix, "/num_turns/max")] = most;
  metrics["timing_s/agent_loop/tool_calls/mean"] = seconds / samples;
  metrics["agent/tool_calls/mean"] = calls / samples;
  metrics["agent/tool_errors/mean"] = errors / samples;
}

void AddActorUpdateMetrics(const std::vector<v1::UpdateReply>& updated, Metrics& metrics) {
  AddRenamed(updated[0].metrics(), ActorMetricNames(), metrics);
  // The rollout correction's, already over every rank, in verl's names.
  for (const auto& [name, value] : updated[0].metrics()) {
    if (absl::StartsWith(name, "rollout_corr/")) metrics[name] = value;
  }
  // verl's MFU is the batch's FLOPs over the time, the peak and the world: the ranks' mean.
  double mfu = 0;
  for (const v1::UpdateReply& reply : updated) {
    const auto found = reply.metrics().find("mfu");
    if (found != reply.metrics().end()) mfu += found->second;
  }
  metrics["perf/mfu/actor"] = mfu / static_cast<double>(updated.size());
  if (const std::optional<double> checksum = Largest(updated, "weights_checksum")) {
    metrics["actor/weights_checksum"] = *checksum;
  }
  for (const char* memory :
       {"max_memory_allocated_gb", "max_memory_reserved_gb", "update_max_memory_allocated_gb"}) {
    if (const std::optional<double> peak = Largest(updated, memory)) {
      metrics[absl::StrCat("perf/", memory)] = *peak;
    }
  }
}

void AddCriticUpdateMetrics(const std::vector<v1::UpdateReply>& updated, Metrics& metrics) {
  AddRenamed(updated[0].metrics(), CriticMetricNames(), metrics);
}

void AddTimePerToken(const StepTokens& tokens, Metrics& metrics) {
  const double all_tokens = std::max(1.0, tokens.response + tokens.prompt);
  for (const char* stage :
       {"gen", "old_log_prob", "ref", "values", "reward", "adv", "update_critic", "update_actor"}) {
    const auto timed_stage = metrics.find(absl::StrCat("timing_s/", stage));
    if (timed_stage == metrics.end()) continue;
    const double stage_tokens =
        std::string_view(stage) == "gen" ? std::max(1.0, tokens.response) : all_tokens;
    metrics[absl::StrCat("timing_per_token_ms/", stage)] =
        timed_stage->second * 1000 / stage_tokens;
  }
}

void RecordStepTime(double seconds, int world_size, Metrics& metrics) {
  metrics["timing_s/step"] = seconds;
  metrics["perf/time_per_step"] = seconds;
  metrics["perf/throughput"] =
      metrics["perf/total_num_tokens"] / std::max(seconds, 1e-9) / std::max(1, world_size);
}

}  // namespace rlhfd::controller
