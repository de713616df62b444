// The decoder layer's fused element-wise kernels; see layer_kernels.h. Element-wise kernels run a
// grid-stride loop, one element a thread; the norm runs one block a row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "worker/model/layer_kernels.h"

namespace rlhfd::model::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 16;  // grid-stride beyond this

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}

// Calls f with a value of the C++ type of `type`.
template <typename F>
void Dispatch(ElementType type, F&& f) {
  switch (type) {
    case ElementType::kFloat32:
      f(float{});
      return;
    case ElementType::kBFloat16:
      f(__nv_bfloat16{});
      return;
    case ElementType::kFloat16:
      f(__half{});
      return;
  }
}

// The same for the narrow types a GEMM reads (bf16, fp16).
template <typename F>
void DispatchNarrow(ElementType type, F&& f) {
  if (type == ElementType::kFloat32) throw std::invalid_argument("layer kernels: narrow dtype");
  Dispatch(type, f);
}

unsigned Blocks(int64_t n) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min((n + kThreads - 1) / kThreads, kMaxBlocks)));
}

void Check(cudaError_t error) {
  if (error != cudaSuccess) throw std::runtime_error(cudaGetErrorString(error));
}

__device__ __forceinline__ float Sigmoid(float g) { return 1.f / (1.f + expf(-g)); }

template <typename In, typename Out>
__global__ void SwiGluForwardKernel(const In* gate, const In* up, Out* out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = ToFloat(gate[i]);
    out[i] = FromFloat<Out>(g * Sigmoid(g) * ToFloat(up[i]));
  }
}

template <typename Grad, typename In>
__global__ void SwiGluBackwardKernel(const Grad* grad, const In* gate, const In* up, In* grad_gate,
                                     In* grad_up, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float dy = ToFloat(grad[i]), g = ToFloat(gate[i]), u = ToFloat(up[i]);
    const float s = Sigmoid(g);
    // d silu(g) / dg = s + g·s·(1 - s)
    grad_gate[i] = FromFloat<In>(dy * u * s * (1.f + g * (1.f - s)));
    grad_up[i] = FromFloat<In>(dy * g * s);
  }
}

template <typename Out>
__global__ void __launch_bounds__(kThreads)
    RmsNormRowsKernel(const float* x, const float* weight, int64_t width, float eps, Out* y,
                      float* rstd) {
  const int64_t row = blockIdx.x;
  const float* in = x + row * width;
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) sum += in[j] * in[j];
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
  __shared__ float warp_sums[kThreads / 32];
  __shared__ float row_rstd;
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    row_rstd = rsqrtf(total / static_cast<float>(width) + eps);
    rstd[row] = row_rstd;
  }
  __syncthreads();
  const float r = row_rstd;
  Out* out = y + row * width;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) {
    out[j] = FromFloat<Out>(in[j] * r * weight[j]);
  }
}

template <typename In, typename Out>
__global__ void RopeKernel(const In* x, const float* cos, const float* sin, RopeShape shape,
                           bool transposed, Out* out) {
  const int64_t half = shape.dim / 2;
  const int64_t n = shape.batch * shape.tokens * shape.heads * shape.dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = i % shape.dim;
    const int64_t h = (i / shape.dim) % shape.heads;
    const int64_t t = (i / (shape.dim * shape.heads)) % shape.tokens;
    const int64_t b = i / (shape.dim * shape.heads * shape.tokens);
    const In* row = x + b * shape.x_strides[0] + t * shape.x_strides[1] + h * shape.x_strides[2];
    const int64_t table = b * shape.table_strides[0] + t * shape.table_strides[1];
    const bool first = d < half;
    const int64_t partner = first ? d + half : d - half;
    const float own = ToFloat(row[d]) * cos[table + d];
    // Forward: y_d = x_d cos_d - x_{d+h} sin_d (first half), x_d cos_d + x_{d-h} sin_d (second).
    // Transposed: g_d cos_d + g_{d+h} sin_{d+h} (first half), g_d cos_d - g_{d-h} sin_{d-h}.
    const float sine = transposed ? sin[table + partner] : sin[table + d];
    const float other = ToFloat(row[partner]) * sine;
    out[i] = FromFloat<Out>((first != transposed) ? own - other : own + other);
  }
}

}  // namespace

void SwiGluForward(const void* gate, const void* up, ElementType in, void* out,
                   ElementType out_type, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  Dispatch(in, [&](auto in_tag) {
    using In = decltype(in_tag);
    DispatchNarrow(out_type, [&](auto out_tag) {
      using Out = decltype(out_tag);
      SwiGluForwardKernel<In, Out><<<Blocks(n), kThreads, 0, stream>>>(
          static_cast<const In*>(gate), static_cast<const In*>(up), static_cast<Out*>(out), n);
    });
  });
  Check(cudaGetLastError());
}

void SwiGluBackward(const void* grad, ElementType grad_type, const void* gate, const void* up,
                    ElementType in, void* grad_gate, void* grad_up, int64_t n,
                    cudaStream_t stream) {
  if (n == 0) return;
  DispatchNarrow(grad_type, [&](auto grad_tag) {
    using Grad = decltype(grad_tag);
    Dispatch(in, [&](auto in_tag) {
      using In = decltype(in_tag);
      SwiGluBackwardKernel<Grad, In><<<Blocks(n), kThreads, 0, stream>>>(
          static_cast<const Grad*>(grad), static_cast<const In*>(gate), static_cast<const In*>(up),
          static_cast<In*>(grad_gate), static_cast<In*>(grad_up), n);
    });
  });
  Check(cudaGetLastError());
}

void RmsNormRows(const float* x, const float* weight, int64_t rows, int64_t width, float eps,
                 void* y, ElementType out_type, float* rstd, cudaStream_t stream) {
  if (rows == 0) return;
  DispatchNarrow(out_type, [&](auto out_tag) {
    using Out = decltype(out_tag);
    RmsNormRowsKernel<Out><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        x, weight, width, eps, static_cast<Out*>(y), rstd);
  });
  Check(cudaGetLastError());
}

void Rope(const void* x, ElementType x_type, const float* cos, const float* sin,
          const RopeShape& shape, bool transposed, void* out, ElementType out_type,
          cudaStream_t stream) {
  const int64_t n = shape.batch * shape.tokens * shape.heads * shape.dim;
  if (n == 0) return;
  Dispatch(x_type, [&](auto in_tag) {
    using In = decltype(in_tag);
    Dispatch(out_type, [&](auto out_tag) {
      using Out = decltype(out_tag);
      RopeKernel<In, Out><<<Blocks(n), kThreads, 0, stream>>>(
          static_cast<const In*>(x), cos, sin, shape, transposed, static_cast<Out*>(out));
    });
  });
  Check(cudaGetLastError());
}

}  // namespace rlhfd::model::kernels
