#include "worker/roles/generated_rows.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/algorithms/on_policy.h"
#include "common/stages/step_tensors.h"
#include "common/status/status_macros.h"
#include "common/util/stopwatch.h"
#include "worker/roles/rollout_sampling.h"

namespace rlhfd::roles {
namespace {

// The step's rows in verl's layout (each prompt left-padded to P, its responses right-padded to
// R, as `batch` began them) on `device`, each row's source, and each row's info and the token
// counts in `reply`.
absl::Status PutRollout(const v1::GenerateRequest& request, const PromptRequests& encoded,
                        const std::vector<rollout::GenerationResult>& results,
                        const at::Device& device, StepBatch& batch, v1::GenerateReply& reply) {
  const int64_t p = batch.prompt_length(), r = batch.response_length();
  const int64_t local = batch.rows().size();
  at::Tensor input_ids = at::zeros({local, p + r}, at::kLong);
  at::Tensor attention_mask = at::zeros({local, p + r}, at::kLong);
  at::Tensor response_mask = at::zeros({local, r}, at::kFloat);
  at::Tensor rollout_log_probs = at::zeros({local, r}, at::kFloat);
  double response_tokens = 0, truncated = 0, prompt_tokens = 0;
  int64_t row = 0;
  for (int64_t i = 0; i < request.prompts_size(); ++i) {
    const std::vector<int64_t>& prompt = encoded.requests[i].prompt_ids;
    const int64_t length = static_cast<int64_t>(prompt.size());
    for (const rollout::Completion& sample : results[i].samples) {
      const int64_t produced = static_cast<int64_t>(sample.token_ids.size());
      input_ids[row].narrow(0, p - length, length).copy_(at::tensor(prompt, at::kLong));
      attention_mask[row].narrow(0, p - length, length).fill_(1);
      if (produced > 0) {
        input_ids[row].narrow(0, p, produced).copy_(at::tensor(sample.token_ids, at::kLong));
        attention_mask[row].narrow(0, p, produced).fill_(1);
        // 1 where the model sampled, 0 where a multi-turn rollout inserted a tool's response:
        // those tokens are read, but are no action of the policy's (verl's response_mask).
        response_mask[row]
            .narrow(0, 0, produced)
            .copy_(at::tensor(
                std::vector<float>(sample.response_mask.begin(), sample.response_mask.end())));
        rollout_log_probs[row].narrow(0, 0, produced).copy_(at::tensor(sample.logprobs));
      }
      v1::RowInfo* info = reply.add_rows();
      info->set_prompt_tokens(static_cast<int32_t>(length));
      info->set_response_tokens(static_cast<int32_t>(produced));
      info->set_truncated(sample.finish_reason == rollout::FinishReason::kLength);
      batch.sources().push_back({request.prompts(i).ground_truth_json(),
                                 request.prompts(i).data_source(), encoded.texts[i],
                                 request.prompts(i).extra_info_json()});
      response_tokens += static_cast<double>(produced);
      prompt_tokens += static_cast<double>(length);
      truncated += info->truncated() ? 1 : 0;
      ++row;
    }
  }
  RETURN_IF_ERROR(batch.Put("input_ids", input_ids.to(device)));
  RETURN_IF_ERROR(batch.Put("attention_mask", attention_mask.to(device)));
  RETURN_IF_ERROR(batch.Put("response_mask", response_mask.to(device)));
  RETURN_IF_ERROR(batch.Put("rollout_log_probs", rollout_log_probs.to(device)));
  auto& metrics = *reply.mutable_metrics();
  metrics["response_tokens"] = response_tokens;
  metrics["prompt_tokens"] = prompt_tokens;
  metrics["truncated"] = truncated;
  return absl::OkStatus();
}

// Each response token's weights' step as the rollout_weights_step tensor, and in `reply` the
// figures the driver's staleness metrics come from: the oldest step each response started on
// (summed, and the least), and how many responses span more than one.
absl::Status PutWeightsSteps(const TokenWeightsSteps& weights_steps, const at::Device& device,
                             StepBatch& batch, v1::GenerateReply& reply) {
  const int64_t r = batch.response_length();
  at::Tensor steps = at::zeros({batch.rows().size(), r}, at::kFloat);
  double oldest_sum = 0, oldest_least = std::numeric_limits<double>::infinity(), spanning = 0;
  int64_t row = 0;
  for (const auto& prompt : weights_steps) {
    for (const std::vector<float>& tokens : prompt) {
      if (!tokens.empty()) {
        steps[row].narrow(0, 0, static_cast<int64_t>(tokens.size())).copy_(at::tensor(tokens));
        const auto [least, most] = std::minmax_element(tokens.begin(), tokens.end());
        oldest_sum += *least;
        oldest_least = std::min<double>(oldest_least, *least);
        spanning += *least != *most ? 1 : 0;
      }
      ++row;
    }
  }
  RETURN_IF_ERROR(batch.Put(stages::tensors::kRolloutWeightsStep, steps.to(device)));
  auto& metrics = *reply.mutable_metrics();
  metrics["oldest_weights_step_sum"] = oldest_sum;
  metrics["oldest_weights_step_min"] = oldest_least;
  metrics["partial_responses"] = spanning;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::GenerateReply> GenerateRows(const RowsGenerator& generator,
                                               const v1::GenerateRequest& request,
                                               int64_t total_rows, RowRange rows,
                                               StepBatch& batch) {
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(CheckShare(generator.spec, request, total_rows, rows));
  ASSIGN_OR_RETURN(const PromptRequests encoded, EncodeShare(generator, request));
  google::protobuf::Map<std::string, double> turn_metrics;
  ASSIGN_OR_RETURN(const std::vector<rollout::GenerationResult> results,
                   generator.rollout(encoded.requests, request.key().step(), turn_metrics));
  // This rank's own generating (its tensor-parallel group's), the weights' update left out:
  // generate_s also holds the wait for the other replicas below, so only this tells a slow
  // host apart (the driver's perf/straggler/gen/*).
  const double rollout_seconds = std::max(0.0, SecondsSince(start) - generator.weights_update_s());
  ASSIGN_OR_RETURN(v1::GenerateReply reply, LayOutRows(generator, request, encoded, results,
                                                       nullptr, total_rows, rows, batch));
  auto& metrics = *reply.mutable_metrics();
  metrics.insert(turn_metrics.begin(), turn_metrics.end());
  const double seconds = SecondsSince(start);
  metrics["generate_s"] = seconds;
  metrics["rollout_s"] = rollout_seconds;
  metrics["tokens_per_s"] = metrics["response_tokens"] / std::max(seconds, 1e-9);
  return reply;
}

absl::Status CheckShare(const v1::JobSpec& spec, const v1::GenerateRequest& request,
                        int64_t total_rows, RowRange rows) {
  const int64_t n = spec.roles().actor().rollout().n();
  if (request.prompts_size() * n != rows.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("generate: this rank holds rows [", rows.begin, ", ", rows.end, ") of ",
                     total_rows, ", which is ", rows.size(), " responses, but was given ",
                     request.prompts_size(), " prompts x n ", n));
  }
  return absl::OkStatus();
}

absl::StatusOr<PromptRequests> EncodeShare(const RowsGenerator& generator,
                                           const v1::GenerateRequest& request) {
  return EncodeRequests(generator.tokenizer, request.prompts(), generator.spec.data(),
                        request.first_prompt(), request.seed(), TrainingSampling(generator.spec),
                        generator.tools);
}

absl::StatusOr<v1::GenerateReply> LayOutRows(const RowsGenerator& generator,
                                             const v1::GenerateRequest& request,
                                             const PromptRequests& encoded,
                                             const std::vector<rollout::GenerationResult>& results,
                                             const TokenWeightsSteps* weights_steps,
                                             int64_t total_rows, RowRange rows, StepBatch& batch) {
  generator.release_cache();  // the update needs the memory
  // P and R over the whole batch: every rank of the pool lays its rows out the same way.
  std::vector<double> longest = {1, 1};
  for (int64_t i = 0; i < request.prompts_size(); ++i) {
    longest[0] = std::max<double>(longest[0], encoded.requests[i].prompt_ids.size());
    for (const rollout::Completion& sample : results[i].samples) {
      longest[1] = std::max<double>(longest[1], sample.token_ids.size());
    }
  }
  RETURN_IF_ERROR(generator.reduce_longest(longest));
  const int64_t p = static_cast<int64_t>(longest[0]), r = static_cast<int64_t>(longest[1]);

  batch.Begin(request.key().step(), total_rows, rows, p, r);
  v1::GenerateReply reply;
  RETURN_IF_ERROR(PutRollout(request, encoded, results, generator.device, batch, reply));
  if (weights_steps != nullptr) {
    RETURN_IF_ERROR(PutWeightsSteps(*weights_steps, generator.device, batch, reply));
  }
  if (algorithms::OldLogProbsFromRollout(generator.spec)) {
    // verl's bypass mode: the rollout's log-probs are the old ones.
    ASSIGN_OR_RETURN(const at::Tensor rollout_log_probs, batch.Get("rollout_log_probs", "bypass"));
    RETURN_IF_ERROR(batch.Put("old_log_probs", rollout_log_probs.clone()));
  }
  reply.set_prompt_length(static_cast<int32_t>(p));
  reply.set_response_length(static_cast<int32_t>(r));
  return reply;
}

absl::Status AdoptRows(const v1::JobSpec& spec, const model::Tokenizer& tokenizer,
                       absl::Span<const std::string> tools, const v1::GenerateRequest& request,
                       StepBatch& batch) {
  const int64_t n = spec.roles().actor().rollout().n();
  const int64_t step = request.key().step();
  if (!batch.begun() || batch.step() != step || !batch.sources().empty() ||
      batch.rows().size() != request.prompts_size() * n ||
      batch.rows().begin != request.first_prompt() * n) {
    return absl::FailedPreconditionError(absl::StrCat(
        "generate: step ", step, "'s rows from the rollout pool were not moved here for prompts [",
        request.first_prompt(), ", ", request.first_prompt() + request.prompts_size(),
        ") (the rollout pool generates, then its rows move to the actor ranks)"));
  }
  ASSIGN_OR_RETURN(const PromptRequests encoded,
                   EncodeRequests(tokenizer, request.prompts(), spec.data(), request.first_prompt(),
                                  request.seed(), TrainingSampling(spec), tools));
  for (int64_t i = 0; i < request.prompts_size(); ++i) {
    for (int64_t k = 0; k < n; ++k) {
      batch.sources().push_back({request.prompts(i).ground_truth_json(),
                                 request.prompts(i).data_source(), encoded.texts[i],
                                 request.prompts(i).extra_info_json()});
    }
  }
  if (algorithms::OldLogProbsFromRollout(spec)) {
    ASSIGN_OR_RETURN(const at::Tensor rollout_log_probs, batch.Get("rollout_log_probs", "bypass"));
    RETURN_IF_ERROR(batch.Put("old_log_probs", rollout_log_probs.clone()));
  }
  return absl::OkStatus();
}

}  // namespace rlhfd::roles
