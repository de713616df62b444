// The step's rows from a rollout, as the rank that generates them lays them out (the actor's
// ranks through the hybrid engine, or a rollout pool of its own): prompts encoded, responses
// generated, P and R agreed over the generating pool, and the rows in verl's layout (each prompt
// left-padded to P, its responses right-padded to R) with each row's source. And the other half
// of a rollout pool's step: the actor ranks that receive the rows record their sources.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/util/row_split.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "rlhfd/v1/worker_service.pb.h"
#include "worker/model/tokenizer.h"
#include "worker/roles/rollout_sampling.h"
#include "worker/roles/step_batch.h"
#include "worker/rollout/engine.h"

namespace rlhfd::roles {

// How one pool's rank generates.
struct RowsGenerator {
  const v1::JobSpec& spec;
  const model::Tokenizer& tokenizer;
  at::Device device;
  absl::Span<const std::string> tools;  // what a multi-turn chat prompt lists
  // The responses to `requests` (adding its own figures to `metrics`).
  std::function<absl::StatusOr<std::vector<rollout::GenerationResult>>(
      const std::vector<rollout::GenerationRequest>& requests, int64_t step,
      google::protobuf::Map<std::string, double>& metrics)>
      rollout;
  // Seconds the last rollout spent bringing its weights up to date (not generating).
  std::function<double()> weights_update_s;
  // Frees the rollout's cache once the responses are in (the update needs the memory).
  std::function<void()> release_cache;
  // The longest prompt and response over the generating pool, in place (every rank lays its rows
  // out the same way).
  std::function<absl::Status(std::vector<double>& longest)> reduce_longest;
};

// Generates rollout.n responses to each of this rank's prompts and starts `batch` for the step
// with this rank's rows (`rows` of `total_rows`): input_ids, attention_mask, response_mask,
// rollout_log_probs (and old_log_probs in bypass mode), and each row's source. The reply holds
// each row's info, P and R, and generate_s, rollout_s, tokens_per_s and the token counts.
absl::StatusOr<v1::GenerateReply> GenerateRows(const RowsGenerator& generator,
                                               const v1::GenerateRequest& request,
                                               int64_t total_rows, RowRange rows, StepBatch& batch);

// A rollout made in parts (trainer.mode async with partial rollouts) uses GenerateRows' halves:
// INVALID_ARGUMENT unless `request`'s prompts, n each, are this rank's `rows`;
absl::Status CheckShare(const v1::JobSpec& spec, const v1::GenerateRequest& request,
                        int64_t total_rows, RowRange rows);
// the engine's requests for `request`'s prompts;
absl::StatusOr<PromptRequests> EncodeShare(const RowsGenerator& generator,
                                           const v1::GenerateRequest& request);
// and once every response is finished, the rows laid out as GenerateRows does, with (when
// `weights_steps` is given: by prompt, response and token, the step whose update the weights that
// sampled the token include) the rollout_weights_step tensor and the oldest step's figures.
using TokenWeightsSteps = std::vector<std::vector<std::vector<float>>>;
absl::StatusOr<v1::GenerateReply> LayOutRows(const RowsGenerator& generator,
                                             const v1::GenerateRequest& request,
                                             const PromptRequests& encoded,
                                             const std::vector<rollout::GenerationResult>& results,
                                             const TokenWeightsSteps* weights_steps,
                                             int64_t total_rows, RowRange rows, StepBatch& batch);

// An actor rank of a job with a rollout pool, once the step's rows moved here from it: records
// the source of each row of `request`'s prompts (encoded as the rollout pool encoded them), and in
// bypass mode the rollout's log-probs as the old ones. FAILED_PRECONDITION unless `batch` holds
// the step's rows for exactly these prompts.
absl::Status AdoptRows(const v1::JobSpec& spec, const model::Tokenizer& tokenizer,
                       absl::Span<const std::string> tools, const v1::GenerateRequest& request,
                       StepBatch& batch);

}  // namespace rlhfd::roles
