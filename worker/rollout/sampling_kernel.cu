// Sampling on the device: one block per row reads the row's logits once, keeping an online
// log-sum-exp (for the drawn token's log-probability) and the running argmax of logits + Gumbel
// noise (the draw) at the same time.
#include <cmath>
#include <cstdint>

#include "worker/rollout/kernels.h"
#include "worker/rollout/sampling_math.h"

namespace rlhfd::rollout::kernels {
namespace {

constexpr int kThreads = 1024;

// Running log-sum-exp as (max, sum of exp(x - max)).
struct LogSumExp {
  float max = -INFINITY;
  float sum = 0.f;
};

__device__ __forceinline__ LogSumExp Merge(LogSumExp a, LogSumExp b) {
  if (b.max == -INFINITY) return a;
  if (a.max == -INFINITY) return b;
  const float m = fmaxf(a.max, b.max);
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

__device__ __forceinline__ void Add(LogSumExp& a, float z) {
  if (z > a.max) {
    a.sum = a.sum * expf(a.max - z) + 1.f;
    a.max = z;
  } else {
    a.sum += expf(z - a.max);
  }
}

// The larger key wins; ties go to the smaller vocabulary id (as argmax does).
__device__ __forceinline__ void Better(float& key, int& index, float other_key, int other_index) {
  if (other_key > key || (other_key == key && other_index < index)) {
    key = other_key;
    index = other_index;
  }
}

__global__ void __launch_bounds__(kThreads)
    SampleRowsKernel(const float* __restrict__ logits, int64_t row_stride, int vocab,
                     const float* __restrict__ temperature, const int64_t* __restrict__ seeds,
                     const int64_t* __restrict__ counters, int64_t* __restrict__ tokens,
                     float* __restrict__ logprobs) {
  const int row = blockIdx.x;
  const float* x = logits + row * row_stride;
  const float t = temperature[row];
  const bool greedy = !(t > 0.f);
  const float inverse_t = greedy ? 1.f : 1.f / t;
  const uint64_t seed = static_cast<uint64_t>(seeds[row]);
  const uint64_t counter = static_cast<uint64_t>(counters[row]);

  LogSumExp lse;
  float best = -INFINITY;
  int best_index = vocab;
  for (int v = threadIdx.x; v < vocab; v += kThreads) {
    const float z = x[v] * inverse_t;
    if (z == -INFINITY) continue;  // Filtered out (top-k / top-p).
    Add(lse, z);
    const float key = greedy ? z : z + Gumbel(seed, counter, v);
    Better(best, best_index, key, v);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const LogSumExp other = {__shfl_xor_sync(0xffffffff, lse.max, offset),
                             __shfl_xor_sync(0xffffffff, lse.sum, offset)};
    lse = Merge(lse, other);
    const float other_best = __shfl_xor_sync(0xffffffff, best, offset);
    const int other_index = __shfl_xor_sync(0xffffffff, best_index, offset);
    Better(best, best_index, other_best, other_index);
  }
  __shared__ LogSumExp lse_shared[kThreads / 32];
  __shared__ float best_shared[kThreads / 32];
  __shared__ int index_shared[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    lse_shared[warp] = lse;
    best_shared[warp] = best;
    index_shared[warp] = best_index;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kThreads / 32; ++w) {
    lse = Merge(lse, lse_shared[w]);
    Better(best, best_index, best_shared[w], index_shared[w]);
  }
  if (best_index >= vocab) {  // Every logit was -inf or NaN: no distribution to draw from.
    tokens[row] = 0;
    logprobs[row] = NAN;
    return;
  }
  tokens[row] = best_index;
  logprobs[row] = x[best_index] * inverse_t - lse.max - logf(lse.sum);
}

}  // namespace

void SampleRows(const float* logits, int64_t row_stride, int batch, int vocab,
                const float* temperature, const int64_t* seeds, const int64_t* counters,
                int64_t* tokens, float* logprobs, cudaStream_t stream) {
  if (batch == 0) return;
  SampleRowsKernel<<<batch, kThreads, 0, stream>>>(logits, row_stride, vocab, temperature, seeds,
                                                   counters, tokens, logprobs);
}

}  // namespace rlhfd::rollout::kernels
