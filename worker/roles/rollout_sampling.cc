#include "worker/roles/rollout_sampling.h"

#include <algorithm>
#include <utility>

#include "common/status/status_macros.h"
#include "worker/roles/prompt_encoding.h"

namespace rlhfd::roles {

uint64_t PromptSeed(uint64_t step_seed, int64_t prompt) {
  uint64_t x = step_seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(prompt + 1);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

int64_t ResponseBudget(const v1::JobSpec& spec) {
  const int32_t configured = spec.roles().actor().rollout().max_new_tokens();
  return configured > 0 ? configured : spec.data().max_response_length();
}

rollout::SamplingParams TrainingSampling(const v1::JobSpec& spec) {
  const v1::RolloutSpec& rollout = spec.roles().actor().rollout();
  rollout::SamplingParams sampling;
  sampling.temperature = rollout.temperature();
  sampling.top_k = std::max(0, rollout.top_k());
  sampling.top_p = rollout.top_p();
  sampling.max_new_tokens = ResponseBudget(spec);
  sampling.stop_token_ids.assign(rollout.stop_token_ids().begin(), rollout.stop_token_ids().end());
  sampling.n = rollout.n();
  return sampling;
}

rollout::SamplingParams ValidationSampling(const v1::JobSpec& spec) {
  const v1::ValidationSampling& val = spec.roles().actor().rollout().val_kwargs();
  rollout::SamplingParams sampling = TrainingSampling(spec);
  sampling.n = std::max(1, val.n());
  sampling.temperature = val.do_sample() ? val.temperature() : 0.0;
  sampling.top_k = std::max(0, val.top_k());
  sampling.top_p = val.top_p() > 0 ? val.top_p() : 1.0;
  return sampling;
}

absl::StatusOr<PromptRequests> EncodeRequests(
    const model::Tokenizer& tokenizer,
    const google::protobuf::RepeatedPtrField<v1::PromptRow>& prompts, const v1::DataSpec& data,
    int64_t first_prompt, uint64_t seed, const rollout::SamplingParams& sampling,
    absl::Span<const std::string> tools) {
  PromptRequests encoded_prompts;
  for (int64_t i = 0; i < prompts.size(); ++i) {
    const int64_t index = first_prompt + i;
    ASSIGN_OR_RETURN(EncodedPrompt encoded,
                     EncodePrompt(tokenizer, prompts[i], data, index, tools));
    rollout::GenerationRequest generation{std::move(encoded.ids), sampling};
    generation.sampling.seed = PromptSeed(seed, index);
    encoded_prompts.requests.push_back(std::move(generation));
    encoded_prompts.texts.push_back(std::move(encoded.text));
  }
  return encoded_prompts;
}

}  // namespace rlhfd::roles
