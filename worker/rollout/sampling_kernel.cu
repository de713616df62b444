// Sampling on the device: each row is split over kSplits blocks (so small batches still fill
// the GPU) and a second kernel merges the splits (one warp per row, one lane per split). A split
// block reads its logits twice, four at a time and two loads in flight per thread (one load at a
// time leaves the kernel waiting on memory latency); the second read comes from cache:
//   1. the largest logit (the greedy draw, and the log-sum-exp's reference) and the Gumbel draws
//      of the first logit each thread reads: a best draw to start from;
//   2. the sum of exp(z - max), and the draws of the other logits - except where z plus an
//      upper bound of the noise is below the best draw so far, which can neither win nor tie.
//      The bound takes the logit alone (kGumbelMax: most of a trained model's vocabulary) or the
//      random bits without the accurate logarithm (GumbelUpperBound), so most noise is never
//      computed, and the draw is the argmax over every logit all the same.
#include <cmath>
#include <cstdint>

#include "worker/rollout/kernels.h"
#include "worker/rollout/sampling_math.h"

namespace rlhfd::rollout::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
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

// A part with max -inf adds nothing, unless its sum is NaN: a split whose only logits besides
// -inf are NaN (NaN never becomes the max) must still make the row's log-sum-exp NaN, as the CPU
// twin's does.
__device__ __forceinline__ LogSumExp Merge(LogSumExp a, LogSumExp b) {
  if (b.max == -INFINITY && !isnan(b.sum)) return a;
  if (a.max == -INFINITY && !isnan(a.sum)) return b;
  const float m = fmaxf(a.max, b.max);
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// The larger key wins; ties go to the smaller vocabulary id (as argmax does). NaN never wins.
__device__ __forceinline__ void Better(float& key, int& index, float other_key, int other_index) {
  if (other_key > key || (other_key == key && other_index < index)) {
    key = other_key;
    index = other_index;
  }
}

__device__ __forceinline__ void WarpBetter(float& key, int& index) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other_key = __shfl_xor_sync(0xffffffff, key, offset);
    const int other_index = __shfl_xor_sync(0xffffffff, index, offset);
    Better(key, index, other_key, other_index);
  }
}

// The block's best (key, index) in every thread.
__device__ __forceinline__ void BlockBetter(float& key, int& index) {
  __shared__ float keys[kWarps];
  __shared__ int indices[kWarps];
  WarpBetter(key, index);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // The arrays may still be read from an earlier call.
  if (lane == 0) {
    keys[warp] = key;
    indices[warp] = index;
  }
  __syncthreads();
  for (int w = 0; w < kWarps; ++w) Better(key, index, keys[w], indices[w]);
}

__device__ __forceinline__ float BlockSum(float sum) {
  __shared__ float sums[kWarps];
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffff, sum, offset);
  if (threadIdx.x % 32 == 0) sums[threadIdx.x / 32] = sum;
  __syncthreads();
  sum = 0.f;
  for (int w = 0; w < kWarps; ++w) sum += sums[w];
  return sum;
}

// Logits [first, first + 4) of row x, -inf (filtered: no part in anything) past `end`.
__device__ __forceinline__ float4 LoadQuad(const float* x, bool aligned, int first, int end) {
  if (aligned && first + 3 < end) return *reinterpret_cast<const float4*>(x + first);
  float4 q;
  q.x = first < end ? x[first] : -INFINITY;
  q.y = first + 1 < end ? x[first + 1] : -INFINITY;
  q.z = first + 2 < end ? x[first + 2] : -INFINITY;
  q.w = first + 3 < end ? x[first + 3] : -INFINITY;
  return q;
}

// Calls visit(v, logit, first_read) for every logit of [begin, end) (begin a multiple of 4):
// thread i takes the quads at begin + 4i, begin + 4i + 4 kThreads, ...; first_read marks the
// first logit the thread reads.
template <typename Visit>
__device__ __forceinline__ void ForEachLogit(const float* x, int begin, int end, Visit visit) {
  const bool aligned = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  constexpr int kStride = 4 * kThreads;
  for (int first = begin + 4 * threadIdx.x; first < end; first += 2 * kStride) {
    const float4 a = LoadQuad(x, aligned, first, end);
    const float4 b = LoadQuad(x, aligned, first + kStride, end);
    const bool first_read = first == begin + 4 * static_cast<int>(threadIdx.x);
    visit(first, a.x, first_read);
    visit(first + 1, a.y, false);
    visit(first + 2, a.z, false);
    visit(first + 3, a.w, false);
    visit(first + kStride, b.x, false);
    visit(first + kStride + 1, b.y, false);
    visit(first + kStride + 2, b.z, false);
    visit(first + kStride + 3, b.w, false);
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
  // A multiple of 4, so every split begins at a quad.
  const int span = ((vocab + kSplits - 1) / kSplits + 3) / 4 * 4;
  const int begin = min(vocab, split * span), end = min(vocab, begin + span);

  // Pass 1. Filtered logits (top-k / top-p: -inf) take no part; NaN never wins.
  float max = -INFINITY, best = -INFINITY;
  int max_index = vocab, best_index = vocab;
  // z rounded once (no multiply-add contracted into a later sum): the skip below compares the
  // same z + bound that the draw it stands for would add up.
  ForEachLogit(x, begin, end, [&](int v, float logit, bool first_read) {
    const float z = __fmul_rn(logit, inverse_t);
    if (z == -INFINITY) return;
    Better(max, max_index, z, v);
    if (!greedy && first_read) Better(best, best_index, z + Gumbel(key, v), v);
  });
  BlockBetter(max, max_index);
  if (greedy) {
    best = max;
    best_index = max_index;
  } else {
    BlockBetter(best, best_index);
  }

  // Pass 2.
  float sum = 0.f;
  ForEachLogit(x, begin, end, [&](int v, float logit, bool first_read) {
    const float z = __fmul_rn(logit, inverse_t);
    if (z == -INFINITY) return;
    sum += expf(z - max);  // NaN (as the row's log-sum-exp) where z is NaN
    if (greedy || first_read || z + kGumbelMax < best) return;
    const uint32_t bits = RandomBits24(key, static_cast<uint32_t>(v));
    if (z + GumbelUpperBound(bits) < best) return;
    Better(best, best_index, z + GumbelFromBits(bits), v);
  });
  sum = BlockSum(sum);
  if (!greedy) BlockBetter(best, best_index);
  if (threadIdx.x == 0) partials[row * kSplits + split] = {max, sum, best, best_index};
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
  for (int offset = 16; offset > 0; offset /= 2) {
    lse = Merge(lse, {__shfl_xor_sync(0xffffffff, lse.max, offset),
                      __shfl_xor_sync(0xffffffff, lse.sum, offset)});
  }
  WarpBetter(best, best_index);
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

bool SampleRows(const float* logits, int64_t row_stride, int batch, int vocab,
                const float* temperature, const int64_t* seeds, const int64_t* counters,
                int64_t* tokens, float* logprobs, void* workspace, cudaStream_t stream) {
  if (batch == 0) return true;
  auto* partials = static_cast<Partial*>(workspace);
  SampleSplitKernel<<<dim3(batch, kSplits), kThreads, 0, stream>>>(
      logits, row_stride, vocab, temperature, seeds, counters, partials);
  if (cudaGetLastError() != cudaSuccess) return false;
  SampleMergeKernel<<<batch, 32, 0, stream>>>(logits, row_stride, vocab, temperature, partials,
                                              tokens, logprobs);
  return cudaGetLastError() == cudaSuccess;
}

}  // namespace rlhfd::rollout::kernels
