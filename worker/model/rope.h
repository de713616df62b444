// Rotary position embeddings as Hugging Face computes them (rotate-half convention), including
// Llama 3's frequency scaling.
#pragma once

#include <ATen/Tensor.h>

#include "worker/model/model_config.h"

namespace rlhfd::model {

// Inverse frequencies, float32 (D/2).
at::Tensor RopeInverseFrequencies(const RopeConfig& rope, int64_t head_dim);

// cos and sin for `positions` (B, T) int64: each (B, T, D) in `dtype`.
std::pair<at::Tensor, at::Tensor> RopeCosSin(const at::Tensor& inv_freq, const at::Tensor& positions,
                                             at::ScalarType dtype);

// x (B, H, T, D) rotated by cos/sin (B, T, D).
at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace rlhfd::model
