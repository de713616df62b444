// The elementwise kernels of the fused decode step (fused_decoder.cc): residual add + RMSNorm,
// rotary embedding + KV-cache append, and SiLU-gated multiply. Each replaces several ATen ops,
// because at small decode batches every kernel costs a few microseconds whatever it does.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "worker/rollout/kernels.h"

namespace rlhfd::rollout::kernels {
namespace {

constexpr int kNormThreads = 256;

__device__ __forceinline__ float WarpSum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffff, x, offset);
  return x;
}

__global__ void __launch_bounds__(kNormThreads)
    AddRmsNormKernel(float* __restrict__ residual, const __nv_bfloat16* __restrict__ delta,
                     bool assign, const __nv_bfloat16* __restrict__ weight,
                     __nv_bfloat16* __restrict__ out, int hidden, float eps) {
  const size_t row = blockIdx.x;
  float* x = residual + row * hidden;
  const __nv_bfloat16* d = delta + row * hidden;
  float sum_squares = 0.f;
  for (int i = threadIdx.x; i < hidden; i += kNormThreads) {
    const float v = (assign ? 0.f : x[i]) + __bfloat162float(d[i]);
    x[i] = v;
    sum_squares += v * v;
  }
  __shared__ float partial[kNormThreads / 32];
  sum_squares = WarpSum(sum_squares);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum_squares;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kNormThreads / 32; ++w) total += partial[w];
  const float scale = rsqrtf(total / hidden + eps);
  for (int i = threadIdx.x; i < hidden; i += kNormThreads) {
    out[row * hidden + i] = __float2bfloat16(__bfloat162float(weight[i]) * (x[i] * scale));
  }
}

// One warp per (row, head) of the fused q/k/v projection output, kRopeWarps warps a block (one
// warp a block left an SM at its limit of 32 resident blocks, half the warps it can hold, and
// this kernel waits on memory latency, not bandwidth). Lane l holds the rotary pairs (i, i + D/2)
// for i = l, l + 32, ...
constexpr int kRopeWarps = 4;

template <int D>
__global__ void __launch_bounds__(kRopeWarps * 32)
    RopeAppendKernel(const __nv_bfloat16* __restrict__ qkv, const int64_t* __restrict__ positions,
                     const int64_t* __restrict__ cache_rows, const float* __restrict__ inv_freq,
                     const __nv_bfloat16* __restrict__ q_norm,
                     const __nv_bfloat16* __restrict__ k_norm, float eps,
                     __nv_bfloat16* __restrict__ q_out, __nv_bfloat16* __restrict__ k_out,
                     __nv_bfloat16* __restrict__ k_cache, __nv_bfloat16* __restrict__ v_cache,
                     int rows, int heads, int kv_heads, int block_size) {
  constexpr int kPairs = D / 64;
  const int all_heads = heads + 2 * kv_heads, lane = threadIdx.x % 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kRopeWarps + threadIdx.x / 32;
  if (item >= static_cast<int64_t>(rows) * all_heads) return;  // A whole warp: item is per warp.
  const int row = static_cast<int>(item / all_heads), head = static_cast<int>(item % all_heads);
  const int width = all_heads * D;
  const __nv_bfloat16* in = qkv + static_cast<size_t>(row) * width + head * D;
  const int64_t position = positions[row];
  float x1[kPairs], x2[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    x1[j] = __bfloat162float(in[lane + 32 * j]);
    x2[j] = __bfloat162float(in[lane + 32 * j + D / 2]);
  }
  const bool is_q = head < heads, is_k = !is_q && head < heads + kv_heads;
  const int kv_head = is_q ? 0 : (is_k ? head - heads : head - heads - kv_heads);
  const size_t block = static_cast<size_t>(cache_rows[row] / block_size);
  const size_t cache_offset =
      ((block * kv_heads + kv_head) * block_size + cache_rows[row] % block_size) * D;
  if (!is_q && !is_k) {  // Values go to the cache as they are.
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      v_cache[cache_offset + lane + 32 * j] = __float2bfloat16(x1[j]);
      v_cache[cache_offset + lane + 32 * j + D / 2] = __float2bfloat16(x2[j]);
    }
    return;
  }
  const __nv_bfloat16* norm = is_q ? q_norm : k_norm;
  if (norm != nullptr) {  // Qwen3: RMSNorm over the head before the rotation.
    float sum_squares = 0.f;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) sum_squares += x1[j] * x1[j] + x2[j] * x2[j];
    const float scale = rsqrtf(WarpSum(sum_squares) / D + eps);
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      x1[j] = __bfloat162float(norm[lane + 32 * j]) * (x1[j] * scale);
      x2[j] = __bfloat162float(norm[lane + 32 * j + D / 2]) * (x2[j] * scale);
    }
  }
  __nv_bfloat16* out =
      is_q ? q_out + (static_cast<size_t>(row) * heads + head) * D : k_cache + cache_offset;
  // Keys also to k_out when asked (a prefill attends its own keys straight away).
  __nv_bfloat16* copy = !is_q && k_out != nullptr
                            ? k_out + (static_cast<size_t>(row) * kv_heads + kv_head) * D
                            : nullptr;
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    // As transformers: angle = position * inv_freq in float32, then cos and sin.
    float sin, cos;
    sincosf(static_cast<float>(position) * inv_freq[lane + 32 * j], &sin, &cos);
    const __nv_bfloat16 first = __float2bfloat16(x1[j] * cos - x2[j] * sin);
    const __nv_bfloat16 second = __float2bfloat16(x2[j] * cos + x1[j] * sin);
    out[lane + 32 * j] = first;
    out[lane + 32 * j + D / 2] = second;
    if (copy != nullptr) {
      copy[lane + 32 * j] = first;
      copy[lane + 32 * j + D / 2] = second;
    }
  }
}

// Grid (column blocks, rows); each thread takes two adjacent columns.
__global__ void SiluMulKernel(const __nv_bfloat16* __restrict__ gate_up,
                              __nv_bfloat16* __restrict__ out, int width) {
  const int row = blockIdx.y, column = 2 * (blockIdx.x * blockDim.x + threadIdx.x);
  if (column >= width) return;
  const __nv_bfloat16* in = gate_up + static_cast<size_t>(row) * 2 * width;
  const float2 gate = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(in + column));
  const float2 up =
      __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(in + width + column));
  const float a = gate.x / (1.f + __expf(-gate.x)) * up.x;
  const float b = gate.y / (1.f + __expf(-gate.y)) * up.y;
  *reinterpret_cast<__nv_bfloat162*>(out + static_cast<size_t>(row) * width + column) =
      __floats2bfloat162_rn(a, b);
}

}  // namespace

void AddRmsNorm(float* residual, const void* delta, bool assign, const void* weight, void* out,
                int rows, int hidden, float eps, cudaStream_t stream) {
  if (rows == 0) return;
  AddRmsNormKernel<<<rows, kNormThreads, 0, stream>>>(
      residual, static_cast<const __nv_bfloat16*>(delta), assign,
      static_cast<const __nv_bfloat16*>(weight), static_cast<__nv_bfloat16*>(out), hidden, eps);
}

bool RopeAppend(const void* qkv, const int64_t* positions, const int64_t* cache_rows,
                const float* inv_freq, const void* q_norm, const void* k_norm, float eps,
                void* q_out, void* k_out, void* k_cache, void* v_cache, int rows, int heads,
                int kv_heads, int head_dim, int block_size, cudaStream_t stream) {
  if (head_dim != 64 && head_dim != 128) return false;
  if (rows == 0) return true;
  const int64_t grid =
      (static_cast<int64_t>(rows) * (heads + 2 * kv_heads) + kRopeWarps - 1) / kRopeWarps;
  if (grid > std::numeric_limits<int>::max()) return false;
  const auto* in = static_cast<const __nv_bfloat16*>(qkv);
  const auto* qn = static_cast<const __nv_bfloat16*>(q_norm);
  const auto* kn = static_cast<const __nv_bfloat16*>(k_norm);
  auto* q = static_cast<__nv_bfloat16*>(q_out);
  auto* k_copy = static_cast<__nv_bfloat16*>(k_out);
  auto* k = static_cast<__nv_bfloat16*>(k_cache);
  auto* v = static_cast<__nv_bfloat16*>(v_cache);
  if (head_dim == 64) {
    RopeAppendKernel<64><<<static_cast<unsigned>(grid), kRopeWarps * 32, 0, stream>>>(
        in, positions, cache_rows, inv_freq, qn, kn, eps, q, k_copy, k, v, rows, heads, kv_heads,
        block_size);
  } else {
    RopeAppendKernel<128><<<static_cast<unsigned>(grid), kRopeWarps * 32, 0, stream>>>(
        in, positions, cache_rows, inv_freq, qn, kn, eps, q, k_copy, k, v, rows, heads, kv_heads,
        block_size);
  }
  return true;
}

void SiluMul(const void* gate_up, void* out, int64_t rows, int width, cudaStream_t stream) {
  if (rows == 0 || width == 0) return;
  // Two columns per thread: the width is even for every model we load (checked by the caller).
  const int threads = 256;
  const dim3 grid((width / 2 + threads - 1) / threads, static_cast<unsigned>(rows));
  SiluMulKernel<<<grid, threads, 0, stream>>>(static_cast<const __nv_bfloat16*>(gate_up),
                                              static_cast<__nv_bfloat16*>(out), width);
}

}  // namespace rlhfd::rollout::kernels
