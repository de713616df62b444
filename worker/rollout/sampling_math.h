// The arithmetic the sampler shares between its CPU loop and its CUDA kernel: a counter-based
// random number generator, so a token's random draw depends only on (request seed, token index,
// vocabulary id) and never on which other requests share the batch.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define RLHFD_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define RLHFD_HOST_DEVICE inline
#endif

namespace rlhfd::rollout {

// SplitMix64's finalizer: a bijection of 64-bit integers with full avalanche.
RLHFD_HOST_DEVICE uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// The seed of sample `index` of a request seeded with `seed` (n samples per prompt).
RLHFD_HOST_DEVICE uint64_t SampleSeed(uint64_t seed, uint64_t index) {
  return Mix64(seed + 0x9e3779b97f4a7c15ULL * (index + 1));
}

// A bijection of 32-bit integers with good avalanche ("lowbias32"); cheap on a GPU, where 64-bit
// multiplies are several instructions each.
RLHFD_HOST_DEVICE uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

// The key of one draw: request seed and the token's index in the response, mixed once per row.
RLHFD_HOST_DEVICE uint64_t DrawKey(uint64_t seed, uint64_t counter) {
  return Mix64(seed ^ (0xd1b54a32d192ed03ULL * (counter + 1)));
}

// Uniform in (0, 1), never 0 or 1, from 24 random bits of (draw key, vocabulary id).
RLHFD_HOST_DEVICE float UniformOpen(uint64_t key, uint32_t index) {
  const uint32_t bits =
      Mix32(Mix32(index ^ static_cast<uint32_t>(key)) + static_cast<uint32_t>(key >> 32));
  return (static_cast<float>(bits >> 8) + 0.5f) * (1.0f / 16777216.0f);
}

// Gumbel noise: argmax(z + Gumbel) is a draw from softmax(z). The inner log needs full precision
// (u near 1 gives the large values that win); the outer one tolerates the GPU's fast log.
RLHFD_HOST_DEVICE float Gumbel(uint64_t key, uint32_t index) {
  const float exponential = -logf(UniformOpen(key, index));
#if defined(__CUDA_ARCH__)
  return -__logf(exponential);
#else
  return -logf(exponential);
#endif
}

}  // namespace rlhfd::rollout
