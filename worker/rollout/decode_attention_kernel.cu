// Decode attention over a slot cache: one new query token per sequence attends the keys its slot
// holds. Split-K ("flash decoding"): one block per (sequence, key/value head, span of 128 keys)
// serves that head's whole query group, so each cached key and value is read once per step, and
// short batches still fill the GPU; four warps take 32 keys each. A second kernel merges the
// spans' online-softmax states.
#include <cuda_bf16.h>

#include <cmath>

#include "worker/rollout/kernels.h"

namespace rlhfd::rollout::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kKeysPerSplit = kWarps * 32;
constexpr int kMaxGroup = 8;  // Query heads per key/value head served by one block.

int Splits(int capacity) { return (capacity + kKeysPerSplit - 1) / kKeysPerSplit; }

__device__ __forceinline__ float WarpMax(float x) {
  for (int offset = 16; offset > 0; offset /= 2)
    x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, offset));
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
                          float* __restrict__ partial_m, float* __restrict__ partial_l,
                          float* __restrict__ partial_acc, int heads, int kv_heads, int capacity,
                          float scale_log2) {
  constexpr int kPerLane = D / 32;  // Output elements each lane accumulates.
  const int row = blockIdx.x, kv_head = blockIdx.y, split = blockIdx.z, splits = gridDim.z;
  const int group = heads / kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int length = static_cast<int>(positions[row]) + 1;
  const int split_begin = split * kKeysPerSplit;
  const int split_end = min(length, split_begin + kKeysPerSplit);
  if (split_begin >= length) {  // A span past the sequence's end: an empty state, merged as none.
    for (int h = threadIdx.x; h < group; h += blockDim.x) {
      partial_m[(static_cast<size_t>(row) * splits + split) * heads + kv_head * group + h] =
          -INFINITY;
    }
    return;
  }
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

  // Each warp's 32 keys of the span, one per lane for the scores, then all lanes together (split
  // over D) for the value sum. A warp past the sequence's end keeps an empty state (m = -inf).
  const int base = split_begin + warp * 32;
  if (base < split_end) {
    const int key = base + lane;
    float s[kMaxGroup];
#pragma unroll
    for (int h = 0; h < kMaxGroup; ++h) s[h] = key < split_end ? 0.f : -INFINITY;
    if (key < split_end) {
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
    const int valid = min(32, split_end - base);
    // (Loading eight value rows at once before the sums measured slower on the H200: 24 vs
    // 17 us per layer at B = 64, from register pressure; four in flight it is.)
#pragma unroll 4
    for (int j = 0; j < valid; ++j) {
      const __nv_bfloat16* value_row = values + static_cast<size_t>(base + j) * D + lane * kPerLane;
      float v[kPerLane];
#pragma unroll
      for (int e = 0; e < kPerLane; e += 2) {
        const float2 f =
            __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(value_row + e));
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
  // This span's state per query head: (max, sum, unnormalised output), in the exp2 domain.
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
    const size_t state = (static_cast<size_t>(row) * splits + split) * heads + kv_head * group + h;
    partial_acc[state * D + d] = o;
    if (d == 0) {
      partial_m[state] = m_max;
      partial_l[state] = l_total;
    }
  }
}

// Merges the spans: one block per (sequence, query head), one thread per output element.
__global__ void MergeSplitsKernel(const float* __restrict__ partial_m,
                                  const float* __restrict__ partial_l,
                                  const float* __restrict__ partial_acc,
                                  __nv_bfloat16* __restrict__ out, int heads, int splits, int d) {
  const int row = blockIdx.x, head = blockIdx.y, i = threadIdx.x;
  const size_t first = static_cast<size_t>(row) * splits * heads + head;  // State of split 0.
  float m_max = -INFINITY;
  for (int s = 0; s < splits; ++s) m_max = fmaxf(m_max, partial_m[first + s * heads]);
  float l_total = 0.f, o = 0.f;
  for (int s = 0; s < splits; ++s) {
    const size_t state = first + static_cast<size_t>(s) * heads;
    if (partial_m[state] == -INFINITY) continue;  // Past the sequence's length: never written.
    const float f = exp2f(partial_m[state] - m_max);
    l_total += partial_l[state] * f;
    o += partial_acc[state * d + i] * f;
  }
  out[(static_cast<size_t>(row) * heads + head) * d + i] = __float2bfloat16(o / l_total);
}

}  // namespace

int64_t DecodeAttentionWorkspaceBytes(int batch, int heads, int head_dim, int capacity) {
  return static_cast<int64_t>(batch) * Splits(capacity) * heads * (head_dim + 2) * sizeof(float);
}

bool DecodeAttention(const void* q, const void* k_cache, const void* v_cache, const int64_t* slots,
                     const int64_t* positions, void* out, void* workspace, int batch, int heads,
                     int kv_heads, int head_dim, int capacity, float scale, cudaStream_t stream) {
  if (kv_heads <= 0 || heads % kv_heads != 0 || heads / kv_heads > kMaxGroup) return false;
  if (head_dim != 64 && head_dim != 128) return false;
  if (batch == 0) return true;
  const int splits = Splits(capacity);
  const size_t states = static_cast<size_t>(batch) * splits * heads;
  float* partial_m = static_cast<float*>(workspace);
  float* partial_l = partial_m + states;
  float* partial_acc = partial_l + states;
  const dim3 grid(batch, kv_heads, splits);
  const float scale_log2 = scale * 1.4426950408889634f;
  const auto* qb = static_cast<const __nv_bfloat16*>(q);
  const auto* kb = static_cast<const __nv_bfloat16*>(k_cache);
  const auto* vb = static_cast<const __nv_bfloat16*>(v_cache);
  if (head_dim == 64) {
    DecodeAttentionKernel<64>
        <<<grid, kWarps * 32, 0, stream>>>(qb, kb, vb, slots, positions, partial_m, partial_l,
                                           partial_acc, heads, kv_heads, capacity, scale_log2);
  } else {
    DecodeAttentionKernel<128>
        <<<grid, kWarps * 32, 0, stream>>>(qb, kb, vb, slots, positions, partial_m, partial_l,
                                           partial_acc, heads, kv_heads, capacity, scale_log2);
  }
  MergeSplitsKernel<<<dim3(batch, heads), head_dim, 0, stream>>>(
      partial_m, partial_l, partial_acc, static_cast<__nv_bfloat16*>(out), heads, splits, head_dim);
  return true;
}

}  // namespace rlhfd::rollout::kernels
