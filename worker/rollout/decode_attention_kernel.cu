// Decode attention over a slot cache: one new query token per sequence attends the keys its slot
// holds. One block per (sequence, key/value head) serves that head's whole query group, so each
// cached key and value is read from memory once per step; four warps split the keys and merge
// their online-softmax states at the end.
#include <cuda_bf16.h>

#include <cmath>

#include "worker/rollout/kernels.h"

namespace rlhfd::rollout::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxGroup = 8;  // Query heads per key/value head served by one block.

__device__ __forceinline__ float WarpMax(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, offset));
  return x;
}

__device__ __forceinline__ float WarpSum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffff, x, offset);
  return x;
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32)
    DecodeAttentionKernel(const __nv_bfloat16* __restrict__ q,
                          const __nv_bfloat16* __restrict__ k_cache,
                          const __nv_bfloat16* __restrict__ v_cache,
                          const int64_t* __restrict__ slots, const int64_t* __restrict__ positions,
                          __nv_bfloat16* __restrict__ out, int heads, int kv_heads, int capacity,
                          float scale_log2) {
  constexpr int kPerLane = D / 32;  // Output elements each lane accumulates.
  const int row = blockIdx.x, kv_head = blockIdx.y;
  const int group = heads / kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int length = static_cast<int>(positions[row]) + 1;
  const size_t head_offset =
      (static_cast<size_t>(slots[row]) * kv_heads + kv_head) * static_cast<size_t>(capacity) * D;
  const __nv_bfloat16* keys = k_cache + head_offset;
  const __nv_bfloat16* values = v_cache + head_offset;

  __shared__ float q_shared[kMaxGroup][D];
  __shared__ float p_shared[kWarps][kMaxGroup][32];
  __shared__ float m_shared[kWarps][kMaxGroup];
  __shared__ float l_shared[kWarps][kMaxGroup];
  __shared__ float acc_shared[kWarps][kMaxGroup][D];

  // Queries pre-scaled by softmax_scale * log2(e), so the softmax runs on exp2.
  const __nv_bfloat16* q_row = q + (static_cast<size_t>(row) * heads + kv_head * group) * D;
  for (int i = threadIdx.x; i < group * D; i += blockDim.x) {
    q_shared[i / D][i % D] = __bfloat162float(q_row[i]) * scale_log2;
  }
  __syncthreads();

  float m[kMaxGroup], l[kMaxGroup], acc[kMaxGroup][kPerLane];
#pragma unroll
  for (int h = 0; h < kMaxGroup; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.f;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) acc[h][e] = 0.f;
  }

  // Each warp takes 32 keys at a time, one per lane for the scores, then all lanes together
  // (split over D) for the value sum.
  for (int base = warp * 32; base < length; base += kWarps * 32) {
    const int key = base + lane;
    float s[kMaxGroup];
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h) s[h] = key < length ? 0.f : -INFINITY;
    if (key < length) {
      const uint4* key_row = reinterpret_cast<const uint4*>(keys + static_cast<size_t>(key) * D);
#pragma unroll
      for (int c = 0; c < D / 8; ++c) {
        const uint4 raw = key_row[c];
        const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
        float k8[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 f = __bfloat1622float2(pairs[i]);
          k8[2 * i] = f.x;
          k8[2 * i + 1] = f.y;
        }
#pragma unroll
        for (int h = 0; h < kMaxGroup; ++h) {
          if (h < group) {
#pragma unroll
            for (int i = 0; i < 8; ++i) s[h] += q_shared[h][c * 8 + i] * k8[i];
          }
        }
      }
    }
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h) {
      if (h < group) {
        // Lane 0's key is always valid, so the chunk maximum is finite.
        const float m_new = fmaxf(m[h], WarpMax(s[h]));
        const float correction = exp2f(m[h] - m_new);
        const float p = exp2f(s[h] - m_new);
        l[h] = l[h] * correction + p;
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) acc[h][e] *= correction;
        m[h] = m_new;
        p_shared[warp][h][lane] = p;
      }
    }
    __syncwarp();
    const int valid = min(32, length - base);
#pragma unroll 4
    for (int j = 0; j < valid; ++j) {
      const __nv_bfloat16* value_row = values + static_cast<size_t>(base + j) * D + lane * kPerLane;
      float v[kPerLane];
#pragma unroll
      for (int e = 0; e < kPerLane; e += 2) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(value_row + e));
        v[e] = f.x;
        v[e + 1] = f.y;
      }
#pragma unroll
      for (int h = 0; h < kMaxGroup; ++h) {
        if (h < group) {
          const float p = p_shared[warp][h][j];
#pragma unroll
          for (int e = 0; e < kPerLane; ++e) acc[h][e] += p * v[e];
        }
      }
    }
    __syncwarp();
  }

  // Merge the warps' partial softmax states.
#pragma unroll
  for (int h = 0; h < kMaxGroup; ++h) {
    if (h < group) {
      const float l_warp = WarpSum(l[h]);
      if (lane == 0) {
        m_shared[warp][h] = m[h];
        l_shared[warp][h] = l_warp;
      }
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) acc_shared[warp][h][lane * kPerLane + e] = acc[h][e];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < group * D; i += blockDim.x) {
    const int h = i / D, d = i % D;
    float m_max = -INFINITY;
    for (int w = 0; w < kWarps; ++w) m_max = fmaxf(m_max, m_shared[w][h]);
    float l_total = 0.f, o = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      // A warp that saw no keys has m = -inf and contributes nothing.
      const float f = m_shared[w][h] == -INFINITY ? 0.f : exp2f(m_shared[w][h] - m_max);
      l_total += l_shared[w][h] * f;
      o += acc_shared[w][h][d] * f;
    }
    out[(static_cast<size_t>(row) * heads + kv_head * group + h) * D + d] =
        __float2bfloat16(o / l_total);
  }
}

}  // namespace

bool DecodeAttention(const void* q, const void* k_cache, const void* v_cache, const int64_t* slots,
                     const int64_t* positions, void* out, int batch, int heads, int kv_heads,
                     int head_dim, int capacity, float scale, cudaStream_t stream) {
  if (kv_heads <= 0 || heads % kv_heads != 0 || heads / kv_heads > kMaxGroup) return false;
  if (batch == 0) return true;
  const dim3 grid(batch, kv_heads);
  const float scale_log2 = scale * 1.4426950408889634f;
  const auto* qb = static_cast<const __nv_bfloat16*>(q);
  const auto* kb = static_cast<const __nv_bfloat16*>(k_cache);
  const auto* vb = static_cast<const __nv_bfloat16*>(v_cache);
  auto* ob = static_cast<__nv_bfloat16*>(out);
  switch (head_dim) {
    case 64:
      DecodeAttentionKernel<64><<<grid, kWarps * 32, 0, stream>>>(
          qb, kb, vb, slots, positions, ob, heads, kv_heads, capacity, scale_log2);
      return true;
    case 128:
      DecodeAttentionKernel<128><<<grid, kWarps * 32, 0, stream>>>(
          qb, kb, vb, slots, positions, ob, heads, kv_heads, capacity, scale_log2);
      return true;
    default:
      return false;
  }
}

}  // namespace rlhfd::rollout::kernels
