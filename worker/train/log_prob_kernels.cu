// The fused log-prob kernels; see log_prob_kernels.h.
//
// The forward keeps, per thread, a running (max, Σ e^(z-max), Σ e^(z-max)·z) over its share of
// the row and merges the threads' triples; then lse = max + log Σ e^(z-max) and
// Σ p·z = Σ e^(z-max)·z / Σ e^(z-max). One block per row. The backward is elementwise: one
// thread per four logits, a grid of (blocks over the row, rows).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "worker/model/element_access.cuh"
#include "worker/train/log_prob_kernels.h"

namespace rlhfd::train::kernels {
namespace {

using model::kernels::FromFloat;

constexpr int kRowThreads = 512;
constexpr int kGradientThreads = 256;

struct RowStats {
  float max = -INFINITY;
  float sum = 0.f;  // Σ e^(z - max)
  float dot = 0.f;  // Σ e^(z - max) · z
};

__device__ __forceinline__ void Add(RowStats& s, float z) {
  if (z == -INFINITY) return;  // Probability 0: adds nothing to either sum.
  if (z > s.max) {
    const float scale = expf(s.max - z);  // 0 for the first finite value
    s.sum = s.sum * scale + 1.f;
    s.dot = s.dot * scale + z;
    s.max = z;
  } else {
    const float e = expf(z - s.max);
    s.sum += e;
    s.dot += e * z;
  }
}

__device__ __forceinline__ RowStats Merge(RowStats a, RowStats b) {
  if (b.sum == 0.f) return a;
  if (a.sum == 0.f) return b;
  const float m = fmaxf(a.max, b.max);
  const float sa = expf(a.max - m), sb = expf(b.max - m);
  return {m, a.sum * sa + b.sum * sb, a.dot * sa + b.dot * sb};
}

__device__ __forceinline__ RowStats WarpMerge(RowStats s) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const RowStats other = {__shfl_xor_sync(0xffffffff, s.max, offset),
                            __shfl_xor_sync(0xffffffff, s.sum, offset),
                            __shfl_xor_sync(0xffffffff, s.dot, offset)};
    s = Merge(s, other);
  }
  return s;
}

__global__ void __launch_bounds__(kRowThreads)
    LogProbRowsKernel(const float* __restrict__ logits, int vocab,
                      const int64_t* __restrict__ targets, float* __restrict__ log_prob,
                      float* __restrict__ entropy, float* __restrict__ lse) {
  const int row = blockIdx.x;
  const float* z = logits + static_cast<int64_t>(row) * vocab;
  RowStats s;
  if (vocab % 4 == 0) {  // Rows start 16-byte aligned: vector loads.
    const float4* z4 = reinterpret_cast<const float4*>(z);
    for (int v = threadIdx.x; v < vocab / 4; v += kRowThreads) {
      const float4 q = z4[v];
      Add(s, q.x);
      Add(s, q.y);
      Add(s, q.z);
      Add(s, q.w);
    }
  } else {
    for (int v = threadIdx.x; v < vocab; v += kRowThreads) Add(s, z[v]);
  }
  s = WarpMerge(s);
  __shared__ RowStats warps[kRowThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warps[warp] = s;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kRowThreads / 32; ++w) s = Merge(s, warps[w]);
  const float row_lse = s.max + logf(s.sum);
  lse[row] = row_lse;
  entropy[row] = row_lse - s.dot / s.sum;
  const int64_t target = targets[row];
  // An id outside the vocabulary has no logit: NaN, never a read past the row.
  log_prob[row] = target >= 0 && target < vocab ? z[target] - row_lse : NAN;
}

template <typename T>
__global__ void __launch_bounds__(kGradientThreads)
    LogProbGradientKernel(const float* __restrict__ logits, int vocab,
                          const int64_t* __restrict__ targets, const float* __restrict__ lse,
                          const float* __restrict__ entropy, const float* __restrict__ g_log_prob,
                          const float* __restrict__ g_entropy, T* __restrict__ grad) {
  const int row = blockIdx.y;
  const int64_t base = static_cast<int64_t>(row) * vocab;
  const float row_lse = lse[row], h = entropy[row], g_lp = g_log_prob[row], g_h = g_entropy[row];
  const int64_t target = targets[row];
  // grad_j = -p_j · (g_lp + g_h · (z_j - lse + H)), plus g_lp at the target.
  const auto gradient = [&](int v, float z) {
    const float log_p = z - row_lse;
    float g = -expf(log_p) * (g_lp + g_h * (log_p + h));
    if (v == target) g += g_lp;
    return FromFloat<T>(g);
  };
  const int first = (blockIdx.x * kGradientThreads + threadIdx.x) * 4;
  if (first >= vocab) return;
  if (vocab % 4 == 0) {
    const float4 q = *reinterpret_cast<const float4*>(logits + base + first);
    T* out = grad + base + first;
    out[0] = gradient(first, q.x);
    out[1] = gradient(first + 1, q.y);
    out[2] = gradient(first + 2, q.z);
    out[3] = gradient(first + 3, q.w);
  } else {
    for (int v = first; v < min(first + 4, vocab); ++v)
      grad[base + v] = gradient(v, logits[base + v]);
  }
}

template <typename T>
bool LaunchGradient(const float* logits, int rows, int vocab, const int64_t* targets,
                    const float* lse, const float* entropy, const float* g_log_prob,
                    const float* g_entropy, void* grad, cudaStream_t stream) {
  const int per_block = kGradientThreads * 4;
  constexpr int kMaxGridRows = 65535;  // CUDA's limit on gridDim.y
  for (int begin = 0; begin < rows; begin += kMaxGridRows) {
    const int64_t offset = static_cast<int64_t>(begin) * vocab;
    const dim3 grid((vocab + per_block - 1) / per_block, std::min(kMaxGridRows, rows - begin));
    LogProbGradientKernel<T><<<grid, kGradientThreads, 0, stream>>>(
        logits + offset, vocab, targets + begin, lse + begin, entropy + begin, g_log_prob + begin,
        g_entropy + begin, static_cast<T*>(grad) + offset);
    if (cudaGetLastError() != cudaSuccess) return false;
  }
  return true;
}

}  // namespace

bool LogProbRows(const float* logits, int rows, int vocab, const int64_t* targets, float* log_prob,
                 float* entropy, float* lse, cudaStream_t stream) {
  if (rows == 0 || vocab == 0) return true;
  LogProbRowsKernel<<<rows, kRowThreads, 0, stream>>>(logits, vocab, targets, log_prob, entropy,
                                                      lse);
  return cudaGetLastError() == cudaSuccess;
}

bool LogProbGradient(const float* logits, int rows, int vocab, const int64_t* targets,
                     const float* lse, const float* entropy, const float* g_log_prob,
                     const float* g_entropy, void* grad, model::kernels::ElementType type,
                     cudaStream_t stream) {
  if (rows == 0 || vocab == 0) return true;
  bool launched = false;
  model::kernels::Dispatch(type, [&](auto tag) {
    launched = LaunchGradient<decltype(tag)>(logits, rows, vocab, targets, lse, entropy, g_log_prob,
                                             g_entropy, grad, stream);
  });
  return launched;
}

}  // namespace rlhfd::train::kernels
