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
// y = x * rstd * weight in `out_type` (bf16 or fp16), rstd = 1 / sqrt(mean(x²) + eps) per row
// (float32, kept for the backward).
void RmsNormRows(const float* x, const float* weight, int64_t rows, int64_t width, float eps,
                 void* y, ElementType out_type, float* rstd, cudaStream_t stream);

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
