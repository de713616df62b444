// Log-probabilities and entropy of chosen tokens from logits.
#pragma once

#include <ATen/Tensor.h>

namespace rlhfd::train {

// logits (B, T, V), tokens (B, T) int64 → log p(token) (B, T), in the logits' dtype (float32
// or wider).
at::Tensor TokenLogProbs(const at::Tensor& logits, const at::Tensor& tokens);

// Entropy of each position's distribution (B, T).
at::Tensor TokenEntropy(const at::Tensor& logits);

}  // namespace rlhfd::train
