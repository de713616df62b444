// Launchers of the decoder layer's fused element-wise kernels (the training and scoring forwards
// on a GPU; fused_ops.h wraps them as autograd functions). Plain pointers and a stream, so the
// kernels compile with nvcc alone (no LibTorch headers).
//
// Each replaces a chain of ATen kernels that rounds its intermediates to the GEMMs' dtype (or
// writes them in float32 and casts after) with one pass that computes in float32 and rounds once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "worker/model/element_type.h"

namespace rlhfd::model::kernels {

// out = silu(gate) * up over n elements; gate and up of `in`, out of `out_type` (bf16 or fp16).
void SwiGluForward(const void* gate, const void* up, ElementType in, void* out,
                   ElementType out_type, int64_t n, cudaStream_t stream);

// The gradients of SwiGluForward: grad_gate = grad * up * silu'(gate), grad_up = grad *
// silu(gate). grad of `grad_type` (bf16 or fp16); gate, up and both results of `in`.
void SwiGluBackward(const void* grad, ElementType grad_type, const void* gate, const void* up,
                    ElementType in, void* grad_gate, void* grad_up, int64_t n, cudaStream_t stream);

// RMS norm of `rows` rows of float32 x (rows, width), contiguous, by float32 weight (width):
// y = x · rstd · weight in `out_type` (bf16 or fp16), rstd = 1 / sqrt(mean(x²) + eps) per row
// (float32, kept for the backward). With `delta` (rows × width of delta_type), x + delta is
// normalised instead and written to `sum` (float32): a residual add and the next norm in one
// pass.
struct RmsNormInputs {
  const float* x = nullptr;
  const void* delta = nullptr;
  ElementType delta_type = ElementType::kFloat32;
  float* sum = nullptr;
  const float* weight = nullptr;
  int64_t rows = 0, width = 0;
  float eps = 0;
  void* y = nullptr;
  ElementType out_type = ElementType::kBFloat16;
  float* rstd = nullptr;
};
void RmsNormRows(const RmsNormInputs& inputs, cudaStream_t stream);

// The gradients of RmsNormRows from the output's gradient `grad` (rows × width of grad_type,
// read as it is, no float32 copy), the normalised input x (the sum, where the forward added),
// weight and rstd:
//   grad_x = rstd·w·g − rstd³/width · x · Σ_j g_j·w_j·x_j per row, plus `through` (float32, a
// gradient reaching x by another path, e.g. the residual stream's) where given; written to
// grad_x (float32) and / or grad_x_narrow (narrow_type: the gradient of a narrow delta);
//   grad_weight = Σ over rows of g·x·rstd (float32, width), with `workspace` of
// RmsNormBackwardWorkspace(rows, width) floats. Any output may be null (not wanted).
struct RmsNormGradients {
  const void* grad = nullptr;
  ElementType grad_type = ElementType::kBFloat16;
  const float* x = nullptr;
  const float* weight = nullptr;
  const float* rstd = nullptr;
  int64_t rows = 0, width = 0;
  const float* through = nullptr;
  float* grad_x = nullptr;
  void* grad_x_narrow = nullptr;
  ElementType narrow_type = ElementType::kBFloat16;
  float* grad_weight = nullptr;
  float* workspace = nullptr;
};
int64_t RmsNormBackwardWorkspace(int64_t rows, int64_t width);
void RmsNormBackward(const RmsNormGradients& gradients, cudaStream_t stream);

// Rotary embeddings, Hugging Face's rotate-half convention. x is indexed (batch, token, head, d)
// with element strides x_strides (d contiguous); cos and sin (batch, token, dim) float32 with
// element strides table_strides (d contiguous). out (batch, tokens, heads, dim) contiguous of
// `out_type`: x·cos + rotate_half(x)·sin, or with `transposed` the transposed rotation (the
// backward of that, for a gradient in x's place).
struct RopeShape {
  int64_t batch = 0, tokens = 0, heads = 0, dim = 0;
  int64_t x_strides[3] = {0, 0, 0};   // batch, token, head
  int64_t table_strides[2] = {0, 0};  // batch, token
};
void Rope(const void* x, ElementType x_type, const float* cos, const float* sin,
          const RopeShape& shape, bool transposed, void* out, ElementType out_type,
          cudaStream_t stream);

}  // namespace rlhfd::model::kernels
