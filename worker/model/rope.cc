// RoPE tables; transformers' _compute_default_rope_parameters and _compute_llama3_parameters.
#include "worker/model/rope.h"

#include <ATen/ATen.h>

#include <cmath>

namespace rlhfd::model {

at::Tensor RopeInverseFrequencies(const RopeConfig& rope, int64_t head_dim) {
  // inv_freq[i] = 1 / theta^(2i / D), computed as transformers does (int64 arange, then float).
  at::Tensor exponents = at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) / head_dim;
  at::Tensor inv_freq = 1.0 / at::pow(rope.theta, exponents);
  if (rope.type != "llama3") return inv_freq;
  const double old_context = static_cast<double>(rope.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / rope.low_freq_factor;
  const double high_freq_wavelen = old_context / rope.high_freq_factor;
  at::Tensor wavelen = 2 * M_PI / inv_freq;
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq);
  at::Tensor smooth = (old_context / wavelen - rope.low_freq_factor) /
                      (rope.high_freq_factor - rope.low_freq_factor);
  at::Tensor smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled;
  at::Tensor medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
  return at::where(medium, smoothed, scaled);
}

std::pair<at::Tensor, at::Tensor> RopeCosSin(const at::Tensor& inv_freq, const at::Tensor& positions,
                                             at::ScalarType dtype) {
  // (B, T, 1) x (D/2) → (B, T, D/2) in float32, duplicated to (B, T, D).
  at::Tensor freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq.to(positions.device());
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  // cos/sin (B, T, D) → (B, 1, T, D) to broadcast over heads.
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

}  // namespace rlhfd::model
