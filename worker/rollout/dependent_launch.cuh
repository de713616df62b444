// Programmatic dependent launch (Hopper and later) for the decode step's own kernels. A kernel
// launched by LaunchDependent may be scheduled once every block of the stream's previous kernel
// has started (and called AllowDependents) or finished, instead of after that kernel's end: at a
// decode step's sizes a kernel runs for a few microseconds, and the launch and block scheduling
// of the next would otherwise add about one microsecond each time. Such a kernel must call
// AwaitPrerequisites before it reads or writes anything that earlier kernels write or read; that
// wait returns once the previous kernel has finished and its writes are visible, and since that
// kernel waited on its own predecessor the same way, on every earlier kernel too. Kernels here
// call it first thing, so no block leaves before it (a kernel whose blocks all left early would
// end before its predecessor, and the next kernel's wait would not cover that predecessor).
#pragma once

#include <cuda_runtime.h>

namespace rlhfd::rollout::kernels {

// Whether every architecture this file is compiled for has griddepcontrol (sm_90 on). Built for
// an older one too (and run on a Hopper through its PTX), a kernel's AwaitPrerequisites would be
// empty, so the launch must then not let it start early.
constexpr bool DependentLaunchCompiled() {
#ifdef __CUDA_ARCH_LIST__
  for (const int arch : {__CUDA_ARCH_LIST__}) {
    if (arch < 900) return false;
  }
  return true;
#else
  return false;
#endif
}

__device__ __forceinline__ void AwaitPrerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the next kernel, if launched by LaunchDependent, be scheduled before this one finishes
// (its blocks then wait in AwaitPrerequisites).
__device__ __forceinline__ void AllowDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// A failed launch's error is returned and cleared (launch errors are not sticky), so that it is
// not reported again by whichever CUDA call comes next.
template <typename... Params, typename... Args>
cudaError_t LaunchDependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                            cudaStream_t stream, Args... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = DependentLaunchCompiled() ? 1 : 0;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  const cudaError_t error = cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
  if (error != cudaSuccess) cudaGetLastError();
  return error;
}

}  // namespace rlhfd::rollout::kernels
