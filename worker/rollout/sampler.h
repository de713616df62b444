// Token sampling on the logits' device: greedy, temperature, top-k and top-p, with per-row seeds
// (see sampling_math.h) so results are reproducible per request.
#pragma once

#include <ATen/Tensor.h>

namespace rlhfd::rollout {

// Per-row parameters: (B) tensors on the logits' device.
struct SamplingRows {
  at::Tensor temperature;  // float32; 0 = greedy.
  at::Tensor seeds;        // int64.
  at::Tensor counters;     // int64: the token's index within its response.
  // Undefined when no row filters: top_k int64 (0 = off), top_p float32 (1 = off).
  at::Tensor top_k;
  at::Tensor top_p;
};

struct SampledTokens {
  at::Tensor tokens;    // (B) int64
  at::Tensor logprobs;  // (B) float32
};

// logits (B, V), any floating dtype; read as float32.
SampledTokens SampleTokens(const at::Tensor& logits, const SamplingRows& rows);

// Sets to -inf every logit outside its row's top-k set and then its top-p set, both taken after
// dividing by the temperature (as transformers' warpers do). Exact: a sort per row.
at::Tensor FilterTopKTopP(const at::Tensor& logits, const at::Tensor& temperature,
                          const at::Tensor& top_k, const at::Tensor& top_p);

}  // namespace rlhfd::rollout
