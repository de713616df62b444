#include "worker/rollout/request_check.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace rlhfd::rollout {

absl::Status CheckGenerationRequest(const GenerationRequest& request, size_t index,
                                    int64_t vocab_size, std::optional<int64_t> max_model_len) {
  const SamplingParams& sampling = request.sampling;
  const std::string where = absl::StrCat("request ", index, ": ");
  const int64_t length = static_cast<int64_t>(request.prompt_ids.size());
  if (length == 0) return absl::InvalidArgumentError(where + "empty prompt");
  if (request.resumed) {
    const int64_t so_far = static_cast<int64_t>(request.resumed->token_ids.size());
    if (sampling.n != 1 || so_far >= sampling.max_new_tokens || !sampling.seed ||
        request.resumed->logprobs.size() != request.resumed->token_ids.size() ||
        request.resumed->response_mask.size() != request.resumed->token_ids.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "a resumed sample needs n 1, its own seed, and fewer tokens so far (",
                       so_far, ") than max_new_tokens (", sampling.max_new_tokens,
                       "), each with its log-prob and mask"));
    }
  }
  for (const int64_t id : request.prompt_ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "prompt token id ", id, " outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  if (sampling.max_new_tokens < 1) {
    return absl::InvalidArgumentError(where + "max_new_tokens must be at least 1");
  }
  if (max_model_len && length + sampling.max_new_tokens > *max_model_len) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "prompt (", length, " tokens) + max_new_tokens (",
                     sampling.max_new_tokens, ") exceeds max_model_len ", *max_model_len,
                     "; shorten the prompt, lower max_new_tokens or raise max_model_len"));
  }
  if (!(sampling.temperature >= 0)) {
    return absl::InvalidArgumentError(where + "temperature must be >= 0 (0 = greedy)");
  }
  if (sampling.top_k < 0) return absl::InvalidArgumentError(where + "top_k must be >= 0 (0 = off)");
  if (!(sampling.top_p > 0 && sampling.top_p <= 1)) {
    return absl::InvalidArgumentError(where + "top_p must be in (0, 1]");
  }
  if (sampling.n < 1) return absl::InvalidArgumentError(where + "n must be at least 1");
  return absl::OkStatus();
}

}  // namespace rlhfd::rollout
