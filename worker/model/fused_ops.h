// The decoder layer's element-wise steps as fused GPU kernels (layer_kernels.h), differentiable:
// the training forward and backward and the scoring forwards (reference, reward, values) of bf16
// or fp16 GEMMs on a GPU. Each computes in float32 and rounds its result once to the GEMMs'
// dtype, where ATen's chain of kernels rounds at every step (or writes float32 and casts after).
// transformer.cc calls them where FusedOpsApply; everything else runs ATen's kernels.
#pragma once

#include <ATen/Tensor.h>

#include <utility>

namespace rlhfd::model {

// Whether the fused kernels serve a forward on `device` whose GEMMs compute in `compute`: a CUDA
// build, a CUDA device, bf16 or fp16.
bool FusedOpsApply(const at::Device& device, at::ScalarType compute);

// silu(gate) * up in `out` (bf16 or fp16); gate and up of one shape and dtype. Gradients reach
// both in their dtype.
at::Tensor FusedSwiGlu(const at::Tensor& gate, const at::Tensor& up, at::ScalarType out);

// RMS norm of float32 x (..., C) by float32 weight (C), written in `out` (bf16 or fp16): what
// ApplyRmsNorm then a cast to `out` compute, in one pass. Gradients reach x and the weight in
// float32, computed from the output's gradient as it comes (no float32 copy of it).
at::Tensor FusedRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps,
                        at::ScalarType out);

// (x + delta, the RMS norm of x + delta by weight written in `out`) in one pass: a residual add
// and the next sublayer's norm. x and weight float32, delta of x's shape in float32, bf16 or
// fp16; the sum float32 (as ATen's add writes it, bit for bit). Gradients reach x (float32),
// delta (its dtype) and the weight (float32), the sum's own gradient included, from one kernel.
std::pair<at::Tensor, at::Tensor> FusedAddRmsNorm(const at::Tensor& x, const at::Tensor& delta,
                                                  const at::Tensor& weight, double eps,
                                                  at::ScalarType out);

// x (B, T, H, D), any strides with D contiguous, rotated by float32 cos/sin (B, T, D) as
// ApplyRope does, written contiguous (B, T, H, D) in `out` (bf16 or fp16). The gradient reaches x
// in x's dtype; cos and sin take none.
at::Tensor FusedRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     at::ScalarType out);

}  // namespace rlhfd::model
