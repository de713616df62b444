// The elementwise kernels of the fused decode step (fused_decoder.cc): residual add + RMSNorm,
// rotary embedding + KV-cache append, and SiLU-gated multiply. Each replaces several ATen ops,
// because at small decode batches every kernel costs a few microseconds whatever it does.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "worker/rollout/dependent_launch.cuh"
#include "worker/rollout/kernels.h"

namespace rlhfd::rollout::kernels {
namespace {

constexpr int kNormThreads = 256;
constexpr int kMaxNormHidden = 4 * kNormThreads * 16;  // Four columns, 16 times, a thread.

__device__ __forceinline__ float WarpSum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffff, x, offset);
  return x;
}

// One block per row, each thread holding kVectors groups of four consecutive columns in registers:
// the row is read once, with 16-byte loads of the float32 residual and 8-byte loads of the bf16
// delta (the norm's weight, which may be a view at any even offset, element by element), all
// issued before the first is used (a loop over columns waits on memory once per iteration, which
// is what a decode step's few hundred rows cost: latency, not bandwidth).
template <int kVectors>
__global__ void __launch_bounds__(kNormThreads)
    AddRmsNormKernel(float* __restrict__ residual, const __nv_bfloat16* __restrict__ delta,
                     bool assign, const __nv_bfloat16* __restrict__ weight,
                     __nv_bfloat16* __restrict__ out, int hidden, float eps) {
  AwaitPrerequisites();
  AllowDependents();
  const size_t row = blockIdx.x;
  const int vectors = hidden / 4;
  float4* x = reinterpret_cast<float4*>(residual + row * hidden);
  const uint2* d = reinterpret_cast<const uint2*>(delta + row * hidden);
  uint2* y = reinterpret_cast<uint2*>(out + row * hidden);
  float4 sums[kVectors];
  uint2 deltas[kVectors];
  __nv_bfloat16 weights[kVectors][4];
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    const int i = threadIdx.x + v * blockDim.x;
    if (i >= vectors) break;
    sums[v] = assign ? make_float4(0.f, 0.f, 0.f, 0.f) : x[i];
    deltas[v] = d[i];
#pragma unroll
    for (int j = 0; j < 4; ++j) weights[v][j] = weight[4 * i + j];
  }
  float sum_squares = 0.f;
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    const int i = threadIdx.x + v * blockDim.x;
    if (i >= vectors) break;
    const float2 low = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&deltas[v].x));
    const float2 high = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&deltas[v].y));
    float4& s = sums[v];
    s.x += low.x, s.y += low.y, s.z += high.x, s.w += high.y;
    x[i] = s;
    sum_squares += s.x * s.x + s.y * s.y + s.z * s.z + s.w * s.w;
  }
  __shared__ float partial[kNormThreads / 32];
  sum_squares = WarpSum(sum_squares);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum_squares;
  __syncthreads();
  float total = 0.f;
  for (int warp = 0; warp < static_cast<int>(blockDim.x / 32); ++warp) total += partial[warp];
  const float scale = rsqrtf(total / hidden + eps);
#pragma unroll
  for (int v = 0; v < kVectors; ++v) {
    const int i = threadIdx.x + v * blockDim.x;
    if (i >= vectors) break;
    const __nv_bfloat16(&w)[4] = weights[v];
    const float4& s = sums[v];
    const __nv_bfloat162 low = __floats2bfloat162_rn(__bfloat162float(w[0]) * (s.x * scale),
                                                     __bfloat162float(w[1]) * (s.y * scale));
    const __nv_bfloat162 high = __floats2bfloat162_rn(__bfloat162float(w[2]) * (s.z * scale),
                                                      __bfloat162float(w[3]) * (s.w * scale));
    uint2 packed;
    packed.x = *reinterpret_cast<const uint32_t*>(&low);
    packed.y = *reinterpret_cast<const uint32_t*>(&high);
    y[i] = packed;
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
  AwaitPrerequisites();
  AllowDependents();
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

// Grid (column blocks, row blocks); each thread takes the adjacent columns of one Vector (uint4: 8,
// where the width allows, as every MLP width of a real model does; uint32_t: 2), read and written
// whole, in rows blockIdx.y, blockIdx.y + gridDim.y, … (a grid has at most 65,535 rows of blocks;
// a prefill's rows can be more).
template <typename Vector>
union Bf16Vector {
  Vector whole;
  __nv_bfloat162 pair[sizeof(Vector) / 4];
};

template <typename Vector>
__global__ void SiluMulKernel(const __nv_bfloat16* __restrict__ gate_up,
                              __nv_bfloat16* __restrict__ out, int64_t rows, int width) {
  AwaitPrerequisites();
  AllowDependents();
  constexpr int kPairs = sizeof(Vector) / 4;
  const int column = 2 * kPairs * (blockIdx.x * blockDim.x + threadIdx.x);
  if (column >= width) return;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const __nv_bfloat16* in = gate_up + row * 2 * width;
    Bf16Vector<Vector> gate, up, result;
    gate.whole = *reinterpret_cast<const Vector*>(in + column);
    up.whole = *reinterpret_cast<const Vector*>(in + width + column);
#pragma unroll
    for (int i = 0; i < kPairs; ++i) {
      const float2 g = __bfloat1622float2(gate.pair[i]), u = __bfloat1622float2(up.pair[i]);
      result.pair[i] =
          __floats2bfloat162_rn(g.x / (1.f + __expf(-g.x)) * u.x, g.y / (1.f + __expf(-g.y)) * u.y);
    }
    *reinterpret_cast<Vector*>(out + row * width + column) = result.whole;
  }
}

}  // namespace

bool AddRmsNorm(float* residual, const void* delta, bool assign, const void* weight, void* out,
                int rows, int hidden, float eps, cudaStream_t stream) {
  const auto aligned = [](const void* p, uintptr_t bytes) {
    return reinterpret_cast<uintptr_t>(p) % bytes == 0;
  };
  if (hidden % 4 != 0 || hidden > kMaxNormHidden || !aligned(residual, 16) || !aligned(delta, 8) ||
      !aligned(out, 8)) {
    return false;
  }
  if (rows == 0) return true;
  const int vectors = hidden / 4;
  // Groups a thread holds: the kernel is instantiated for 1, 2, 4, 8 and 16.
  const int per_thread = (vectors + kNormThreads - 1) / kNormThreads;
  const int threads = ((vectors + per_thread - 1) / per_thread + 31) / 32 * 32;
  const auto* d = static_cast<const __nv_bfloat16*>(delta);
  const auto* w = static_cast<const __nv_bfloat16*>(weight);
  auto* y = static_cast<__nv_bfloat16*>(out);
  const auto kernel = per_thread == 1   ? AddRmsNormKernel<1>
                      : per_thread == 2 ? AddRmsNormKernel<2>
                      : per_thread <= 4 ? AddRmsNormKernel<4>
                      : per_thread <= 8 ? AddRmsNormKernel<8>
                                        : AddRmsNormKernel<16>;
  return LaunchDependent(kernel, rows, threads, 0, stream, residual, d, assign, w, y, hidden,
                         eps) == cudaSuccess;
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
  const auto kernel = head_dim == 64 ? RopeAppendKernel<64> : RopeAppendKernel<128>;
  return LaunchDependent(kernel, static_cast<unsigned>(grid), kRopeWarps * 32, 0, stream, in,
                         positions, cache_rows, inv_freq, qn, kn, eps, q, k_copy, k, v, rows, heads,
                         kv_heads, block_size) == cudaSuccess;
}

bool SiluMul(const void* gate_up, void* out, int64_t rows, int width, cudaStream_t stream) {
  if (rows == 0 || width == 0) return true;
  // The width is even for every model we load (checked by the caller); a multiple of 8 and
  // 16-byte aligned rows take 16-byte vectors.
  const auto* in = static_cast<const __nv_bfloat16*>(gate_up);
  auto* result = static_cast<__nv_bfloat16*>(out);
  const bool wide = width % 8 == 0 && reinterpret_cast<uintptr_t>(gate_up) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const int threads = 256, columns = wide ? 8 : 2;
  const dim3 grid((width / columns + threads - 1) / threads,
                  static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  const auto kernel = wide ? SiluMulKernel<uint4> : SiluMulKernel<uint32_t>;
  return LaunchDependent(kernel, grid, threads, 0, stream, in, result, rows, width) == cudaSuccess;
}

}  // namespace rlhfd::rollout::kernels
