// Log-probabilities and entropy of target tokens straight from hidden states and the LM-head
// weight, a chunk of tokens at a time, so no (N, V) float32 logits tensor need exist: the
// forward keeps per-token results, and the backward recomputes each chunk's logits (on the GPU,
// those of the chunks the device had no room to keep since the forward).
//
// Shapes: N = tokens, C = hidden, V = vocabulary.
#pragma once

#include <ATen/Tensor.h>

#include <utility>

namespace rlhfd::train {

// hidden (N, C), weight (V, C) (the LM head or tied embeddings), targets (N) int64.
// Returns {log p(target) (N), entropy (N)}, both float32 (float64 for float64 inputs) and
// differentiable in hidden and weight. `chunk` tokens are processed at a time.
// The hidden states whose logits are those of `hidden` divided by `temperature` (the head is
// linear without a bias): log-probs of a sampling temperature from ChunkedLogProbs. `hidden`
// itself at temperature 1.
at::Tensor TemperatureScaled(const at::Tensor& hidden, double temperature);

std::pair<at::Tensor, at::Tensor> ChunkedLogProbs(const at::Tensor& hidden, const at::Tensor& weight,
                                                  const at::Tensor& targets, int64_t chunk = 4096);

}  // namespace rlhfd::train
