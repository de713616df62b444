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

// 24 random bits of (draw key, vocabulary id).
RLHFD_HOST_DEVICE uint32_t RandomBits24(uint64_t key, uint32_t index) {
  return Mix32(Mix32(index ^ static_cast<uint32_t>(key)) + static_cast<uint32_t>(key >> 32)) >> 8;
}

// -log(u) for u = (bits + 0.5) / 2^24, uniform on (0, 1): an exponential draw, finite and
// positive for every bits < 2^24. Above 1/2, u is taken as 1 - v with v exact in float and
// -log1p(-v) is used: in float, u = 1 - 2^-25 itself rounds to 1, whose -log(u) = 0 made an
// infinite Gumbel draw, so that about one draw in a hundred over a 152k vocabulary picked a
// token regardless of its probability.
RLHFD_HOST_DEVICE float ExponentialFromBits(uint32_t bits) {
  constexpr float kScale = 1.0f / 16777216.0f;  // 2^-24
  if (bits < (1u << 23)) return -logf((static_cast<float>(bits) + 0.5f) * kScale);
  return -log1pf(-(static_cast<float>((1u << 24) - 1u - bits) + 0.5f) * kScale);
}

// Gumbel noise: argmax(z + Gumbel) is a draw from softmax(z). The inner log needs full precision
// (u near 1 gives the large values that win); the outer one tolerates the GPU's fast log.
// Bounded by the 24 bits: within [-2.9, 17.4].
RLHFD_HOST_DEVICE float GumbelFromBits(uint32_t bits) {
  const float exponential = ExponentialFromBits(bits);
#if defined(__CUDA_ARCH__)
  return -__logf(exponential);
#else
  return -logf(exponential);
#endif
}

RLHFD_HOST_DEVICE float Gumbel(uint64_t key, uint32_t index) {
  return GumbelFromBits(RandomBits24(key, index));
}

// Above every GumbelFromBits (host or device): a logit z whose z + kGumbelMax is below the best
// draw so far cannot win, nor tie, and needs no noise drawn.
inline constexpr float kGumbelMax = 17.5f;

// Above GumbelFromBits(bits), host or device, without its accurate logarithm: a draw whose
// logit plus this bound is below the best draw so far cannot win. Below 1/2, u gives
// E = -log(u) > log 2, so G = -log(E) < 0.3666; above, E = -log1p(-v) >= v, so G <= -log(v).
// The margin covers the logarithms' rounding (a few float ulps of values up to 17.4).
RLHFD_HOST_DEVICE float GumbelUpperBound(uint32_t bits) {
  if (bits < (1u << 23)) return 0.37f;
  constexpr float kScale = 1.0f / 16777216.0f;  // 2^-24
  const float v = (static_cast<float>((1u << 24) - 1u - bits) + 0.5f) * kScale;
#if defined(__CUDA_ARCH__)
  return 1e-3f - __logf(v);
#else
  return 1e-3f - logf(v);
#endif
}

}  // namespace rlhfd::rollout
