// The checks every decoder makes of a generation request before it runs any, so that a bad one
// is refused with the field to fix whichever decoder (the engine, the tensor-parallel one) gets it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "worker/rollout/request.h"

namespace rlhfd::rollout {

// Request `index` of a batch: a non-empty prompt of ids in [0, vocab_size), max_new_tokens and
// n at least 1, temperature >= 0, top_k >= 0, top_p in (0, 1], and prompt + max_new_tokens
// within max_model_len where the decoder has one. Errors start "request <index>: ".
absl::Status CheckGenerationRequest(const GenerationRequest& request, size_t index,
                                    int64_t vocab_size, std::optional<int64_t> max_model_len);

}  // namespace rlhfd::rollout
