// Device-side access to the element types of element_type.h, for the worker's CUDA kernels (nvcc
// only): conversions through float32, rounding to nearest once, packs of N elements loaded and
// stored as one aligned access, and a host dispatch from ElementType to the C++ type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "worker/model/element_type.h"

namespace rlhfd::model::kernels {

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}

// N elements read or written by one access (up to 16 bytes a load instruction); the address
// must be aligned to the pack's size (PackAligned on the host).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <int N, typename T>
__device__ __forceinline__ Pack<T, N> LoadPack(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}

template <int N, typename T>
__device__ __forceinline__ void StorePack(T* p, const Pack<T, N>& pack) {
  *reinterpret_cast<Pack<T, N>*>(p) = pack;
}

// Whether p may be accessed by packs of n elements of `bytes` each.
inline bool PackAligned(const void* p, int n, int bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % (static_cast<std::uintptr_t>(n) * bytes) == 0;
}

// Calls f with a value of the C++ type of `type`.
template <typename F>
void Dispatch(ElementType type, F&& f) {
  switch (type) {
    case ElementType::kFloat32:
      f(float{});
      return;
    case ElementType::kBFloat16:
      f(__nv_bfloat16{});
      return;
    case ElementType::kFloat16:
      f(__half{});
      return;
  }
}

}  // namespace rlhfd::model::kernels
