// Sampling on the device: the logits are read once, keeping an online log-sum-exp (for the drawn
// token's log-probability) and the running argmax of logits + Gumbel noise (the draw) at the same
// time. Each row is split over kSplits blocks, so small batches still fill the GPU; a second
// kernel merges the splits (one warp per row, one lane per split).
#include <cmath>
#include <cstdint>

#include "worker/rollout/kernels.h"
#include "worker/rollout/sampling_math.h"

namespace rlhfd::rollout::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kSplits = 32;  // One lane of the merge warp each.

struct Partial {
  float max, sum, best;
  int index;
};

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

__device__ __forceinline__ void WarpMerge(LogSumExp& lse, float& best, int& best_index) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const LogSumExp other = {__shfl_xor_sync(0xffffffff, lse.max, offset),
                             __shfl_xor_sync(0xffffffff, lse.sum, offset)};
    lse = Merge(lse, other);
    const float other_best = __shfl_xor_sync(0xffffffff, best, offset);
    const int other_index = __shfl_xor_sync(0xffffffff, best_index, offset);
    Better(best, best_index, other_best, other_index);
  }
}

__global__ void __launch_bounds__(kThreads)
    SampleSplitKernel(const float* __restrict__ logits, int64_t row_stride, int vocab,
                      const float* __restrict__ temperature, const int64_t* __restrict__ seeds,
                      const int64_t* __restrict__ counters, Partial* __restrict__ partials) {
  const int row = blockIdx.x, split = blockIdx.y;
  const float* x = logits + row * row_stride;
  const float t = temperature[row];
  const bool greedy = !(t > 0.f);
  const float inverse_t = greedy ? 1.f : 1.f / t;
  const uint64_t key =
      DrawKey(static_cast<uint64_t>(seeds[row]), static_cast<uint64_t>(counters[row]));
  const int span = (vocab + kSplits - 1) / kSplits;
  const int end = min(vocab, (split + 1) * span);

  LogSumExp lse;
  float best = -INFINITY;
  int best_index = vocab;
  for (int v = split * span + threadIdx.x; v < end; v += kThreads) {
    const float z = x[v] * inverse_t;
    if (z == -INFINITY) continue;  // Filtered out (top-k / top-p).
    Add(lse, z);
    Better(best, best_index, greedy ? z : z + Gumbel(key, static_cast<uint32_t>(v)), v);
  }
  WarpMerge(lse, best, best_index);
  __shared__ Partial warps[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warps[warp] = {lse.max, lse.sum, best, best_index};
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kThreads / 32; ++w) {
    lse = Merge(lse, {warps[w].max, warps[w].sum});
    Better(best, best_index, warps[w].best, warps[w].index);
  }
  partials[row * kSplits + split] = {lse.max, lse.sum, best, best_index};
}

__global__ void __launch_bounds__(32)
    SampleMergeKernel(const float* __restrict__ logits, int64_t row_stride, int vocab,
                      const float* __restrict__ temperature, const Partial* __restrict__ partials,
                      int64_t* __restrict__ tokens, float* __restrict__ logprobs) {
  const int row = blockIdx.x;
  const Partial mine = partials[row * kSplits + threadIdx.x];
  LogSumExp lse = {mine.max, mine.sum};
  float best = mine.best;
  int best_index = mine.index;
  WarpMerge(lse, best, best_index);
  if (threadIdx.x != 0) return;
  if (best_index >= vocab) {  // Every logit was -inf or NaN: no distribution to draw from.
    tokens[row] = 0;
    logprobs[row] = NAN;
    return;
  }
  const float t = temperature[row];
  const float inverse_t = t > 0.f ? 1.f / t : 1.f;
  tokens[row] = best_index;
  logprobs[row] = logits[row * row_stride + best_index] * inverse_t - lse.max - logf(lse.sum);
}

}  // namespace

int64_t SampleRowsWorkspaceBytes(int batch) {
  return static_cast<int64_t>(batch) * kSplits * sizeof(Partial);
}

void SampleRows(const float* logits, int64_t row_stride, int batch, int vocab,
                const float* temperature, const int64_t* seeds, const int64_t* counters,
                int64_t* tokens, float* logprobs, void* workspace, cudaStream_t stream) {
  if (batch == 0) return;
  auto* partials = static_cast<Partial*>(workspace);
  SampleSplitKernel<<<dim3(batch, kSplits), kThreads, 0, stream>>>(
      logits, row_stride, vocab, temperature, seeds, counters, partials);
  SampleMergeKernel<<<batch, 32, 0, stream>>>(logits, row_stride, vocab, temperature, partials,
                                              tokens, logprobs);
}

}  // namespace rlhfd::rollout::kernels
