// The element types the worker's CUDA kernels read and write, named without CUDA or LibTorch
// headers so that launchers (nvcc) and their callers (g++) share one enum.
#pragma once

namespace rlhfd::model::kernels {

enum class ElementType { kFloat32, kBFloat16, kFloat16 };

}  // namespace rlhfd::model::kernels
