// How the actor samples: the training rollout's parameters, validation's (rollout.val_kwargs),
// the response budget, and each prompt's seed (the same whichever rank generates the prompt).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "rlhfd/v1/worker_service.pb.h"
#include "worker/model/tokenizer.h"
#include "worker/rollout/request.h"

namespace rlhfd::roles {

// Each prompt's sampling seed, from the step's seed and the prompt's place in the batch.
uint64_t PromptSeed(uint64_t step_seed, int64_t prompt);
// rollout.max_new_tokens, or data.max_response_length when that is unset.
int64_t ResponseBudget(const v1::JobSpec& spec);
rollout::SamplingParams TrainingSampling(const v1::JobSpec& spec);
rollout::SamplingParams ValidationSampling(const v1::JobSpec& spec);

// Prompts as the engine takes them: encoded (prompt_encoding.h), with `sampling` seeded per
// prompt from `seed` and the prompt's index (`first_prompt` + i); and each prompt's text.
struct PromptRequests {
  std::vector<rollout::GenerationRequest> requests;
  std::vector<std::string> texts;
};
absl::StatusOr<PromptRequests> EncodeRequests(
    const model::Tokenizer& tokenizer,
    const google::protobuf::RepeatedPtrField<v1::PromptRow>& prompts, const v1::DataSpec& data,
    int64_t first_prompt, uint64_t seed, const rollout::SamplingParams& sampling,
    absl::Span<const std::string> tools = {});

}  // namespace rlhfd::roles
