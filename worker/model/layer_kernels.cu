// The decoder layer's fused element-wise kernels; see layer_kernels.h.
//
// Each is bound by memory traffic, so each reads and writes packs of up to 16 bytes where the
// tensors' addresses and sizes allow (one element at a time otherwise): SwiGLU a grid-stride loop
// over packs, the norm one warp a row (its backward too; the weight's gradient by chunks of
// rows, then one sum a column), the rotation one thread a pair of packs (d, d + dim/2) of
// one token's heads, with that token's cos and sin read once for all its heads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "worker/model/element_access.cuh"
#include "worker/model/layer_kernels.h"

namespace rlhfd::model::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1 << 16;  // grid-stride beyond this
constexpr int kWarp = 32;

unsigned Blocks(int64_t n) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min((n + kThreads - 1) / kThreads, kMaxBlocks)));
}

void Check(cudaError_t error) {
  if (error != cudaSuccess) throw std::runtime_error(cudaGetErrorString(error));
}

// The narrow types a GEMM reads (bf16, fp16).
template <typename F>
void DispatchNarrow(ElementType type, F&& f) {
  if (type == ElementType::kFloat32) throw std::invalid_argument("layer kernels: narrow dtype");
  Dispatch(type, f);
}

// Calls f with std::integral_constant<int, N> for the widest N in {8, 4, 2, 1} that `fits`.
template <typename Fits, typename F>
void DispatchPack(Fits&& fits, F&& f) {
  if (fits(8)) return f(std::integral_constant<int, 8>{});
  if (fits(4)) return f(std::integral_constant<int, 4>{});
  if (fits(2)) return f(std::integral_constant<int, 2>{});
  f(std::integral_constant<int, 1>{});
}

__device__ __forceinline__ float Sigmoid(float g) { return 1.f / (1.f + expf(-g)); }

// Grid-stride over the n / N packs, then the n % N elements left one at a time; body(pack, i)
// with pack a std::integral_constant of the elements from i.
template <int N, typename Body>
__device__ __forceinline__ void ForEachPack(int64_t n, Body&& body) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t packs = n / N;
  for (int64_t p = first; p < packs; p += stride) body(std::integral_constant<int, N>{}, p * N);
  for (int64_t i = packs * N + first; i < n; i += stride) body(std::integral_constant<int, 1>{}, i);
}

template <int N, typename In, typename Out>
__global__ void SwiGluForwardKernel(const In* gate, const In* up, Out* out, int64_t n) {
  ForEachPack<N>(n, [&](auto pack, int64_t i) {
    constexpr int M = decltype(pack)::value;
    const Pack<In, M> g = LoadPack<M>(gate + i), u = LoadPack<M>(up + i);
    Pack<Out, M> y;
#pragma unroll
    for (int k = 0; k < M; ++k) {
      const float gk = ToFloat(g.v[k]);
      y.v[k] = FromFloat<Out>(gk * Sigmoid(gk) * ToFloat(u.v[k]));
    }
    StorePack<M>(out + i, y);
  });
}

template <int N, typename Grad, typename In>
__global__ void SwiGluBackwardKernel(const Grad* grad, const In* gate, const In* up, In* grad_gate,
                                     In* grad_up, int64_t n) {
  ForEachPack<N>(n, [&](auto pack, int64_t i) {
    constexpr int M = decltype(pack)::value;
    const Pack<Grad, M> dy = LoadPack<M>(grad + i);
    const Pack<In, M> g = LoadPack<M>(gate + i), u = LoadPack<M>(up + i);
    Pack<In, M> dg, du;
#pragma unroll
    for (int k = 0; k < M; ++k) {
      const float dyk = ToFloat(dy.v[k]), gk = ToFloat(g.v[k]), uk = ToFloat(u.v[k]);
      const float s = Sigmoid(gk);
      // d silu(g) / dg = s + g·s·(1 - s)
      dg.v[k] = FromFloat<In>(dyk * uk * s * (1.f + gk * (1.f - s)));
      du.v[k] = FromFloat<In>(dyk * gk * s);
    }
    StorePack<M>(grad_gate + i, dg);
    StorePack<M>(grad_up + i, du);
  });
}

// One warp a row, kThreads / 32 rows a block. With delta, the row's x + delta is written to sum
// and normalised; the second pass reads back what the same thread wrote (from cache).
template <int N, typename Delta, typename Out>
__global__ void __launch_bounds__(kThreads)
    RmsNormRowsKernel(const float* x, const Delta* delta, float* sum, const float* weight,
                      int64_t rows, int64_t width, float eps, Out* y, float* rstd) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kThreads / kWarp) + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t offset = row * width;
  float squares = 0.f;
  for (int64_t j = lane * N; j < width; j += kWarp * N) {
    Pack<float, N> p = LoadPack<N>(x + offset + j);
    if (delta != nullptr) {
      const Pack<Delta, N> d = LoadPack<N>(delta + offset + j);
#pragma unroll
      for (int k = 0; k < N; ++k) p.v[k] += ToFloat(d.v[k]);
      StorePack<N>(sum + offset + j, p);
    }
#pragma unroll
    for (int k = 0; k < N; ++k) squares += p.v[k] * p.v[k];
  }
  for (int shift = kWarp / 2; shift > 0; shift /= 2) {
    squares += __shfl_xor_sync(0xffffffff, squares, shift);
  }
  const float r = rsqrtf(squares / static_cast<float>(width) + eps);
  if (lane == 0) rstd[row] = r;
  const float* in = (delta != nullptr ? sum : x) + offset;
  for (int64_t j = lane * N; j < width; j += kWarp * N) {
    const Pack<float, N> p = LoadPack<N>(in + j), w = LoadPack<N>(weight + j);
    Pack<Out, N> o;
#pragma unroll
    for (int k = 0; k < N; ++k) o.v[k] = FromFloat<Out>(p.v[k] * r * w.v[k]);
    StorePack<N>(y + offset + j, o);
  }
}

// One warp a row, as RmsNormRowsKernel: grad_x = rstd·g·w − rstd³/width · x · Σ g·w·x (plus
// `through`), to grad_x and / or narrow.
template <int N, typename Grad, typename Narrow>
__global__ void __launch_bounds__(kThreads)
    RmsNormGradInputKernel(const Grad* grad, const float* x, const float* weight, const float* rstd,
                           int64_t rows, int64_t width, const float* through, float* grad_x,
                           Narrow* narrow) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kThreads / kWarp) + threadIdx.x / kWarp;
  if (row >= rows) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t offset = row * width;
  float dot = 0.f;  // Σ g·w·x
  for (int64_t j = lane * N; j < width; j += kWarp * N) {
    const Pack<Grad, N> gp = LoadPack<N>(grad + offset + j);
    const Pack<float, N> xp = LoadPack<N>(x + offset + j), wp = LoadPack<N>(weight + j);
#pragma unroll
    for (int k = 0; k < N; ++k) dot += ToFloat(gp.v[k]) * wp.v[k] * xp.v[k];
  }
  for (int shift = kWarp / 2; shift > 0; shift /= 2) {
    dot += __shfl_xor_sync(0xffffffff, dot, shift);
  }
  const float r = rstd[row], c = r * r * r * dot / static_cast<float>(width);
  for (int64_t j = lane * N; j < width; j += kWarp * N) {
    const Pack<Grad, N> gp = LoadPack<N>(grad + offset + j);
    const Pack<float, N> xp = LoadPack<N>(x + offset + j), wp = LoadPack<N>(weight + j);
    Pack<float, N> o;
#pragma unroll
    for (int k = 0; k < N; ++k) o.v[k] = r * ToFloat(gp.v[k]) * wp.v[k] - c * xp.v[k];
    if (through != nullptr) {
      const Pack<float, N> tp = LoadPack<N>(through + offset + j);
#pragma unroll
      for (int k = 0; k < N; ++k) o.v[k] += tp.v[k];
    }
    if (grad_x != nullptr) StorePack<N>(grad_x + offset + j, o);
    if (narrow != nullptr) {
      Pack<Narrow, N> n;
#pragma unroll
      for (int k = 0; k < N; ++k) n.v[k] = FromFloat<Narrow>(o.v[k]);
      StorePack<N>(narrow + offset + j, n);
    }
  }
}

// The weight's gradient in two passes: each block sums g·x·rstd over a chunk of rows for
// kWarp·N columns (kThreads / kWarp threads down the rows, one pack of columns each), the chunk's
// sums to partial (chunks, width); then one thread a column adds the chunks.
int64_t NormChunkRows(int64_t rows) {
  constexpr int64_t kMaxGridY = 65535;  // CUDA's limit on gridDim.y: one chunk a block row
  return std::max<int64_t>(128, (rows + kMaxGridY - 1) / kMaxGridY);
}

template <int N, typename Grad>
__global__ void __launch_bounds__(kThreads)
    RmsNormGradWeightKernel(const Grad* grad, const float* x, const float* rstd, int64_t rows,
                            int64_t width, int64_t chunk_rows, float* partial) {
  constexpr int kDown = kThreads / kWarp;
  const int64_t column = (blockIdx.x * static_cast<int64_t>(kWarp) + threadIdx.x % kWarp) * N;
  const int down = threadIdx.x / kWarp;
  const int64_t first = blockIdx.y * chunk_rows;
  const int64_t last = std::min(rows, first + chunk_rows);
  float sum[N] = {};
  if (column < width) {
    for (int64_t row = first + down; row < last; row += kDown) {
      const Pack<Grad, N> gp = LoadPack<N>(grad + row * width + column);
      const Pack<float, N> xp = LoadPack<N>(x + row * width + column);
      const float r = rstd[row];
#pragma unroll
      for (int k = 0; k < N; ++k) sum[k] += ToFloat(gp.v[k]) * xp.v[k] * r;
    }
  }
  __shared__ float sums[kDown][kWarp * N];
#pragma unroll
  for (int k = 0; k < N; ++k) sums[down][(threadIdx.x % kWarp) * N + k] = sum[k];
  __syncthreads();
  if (down != 0 || column >= width) return;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    float total = 0.f;
    for (int d = 0; d < kDown; ++d) total += sums[d][threadIdx.x * N + k];
    partial[blockIdx.y * width + column + k] = total;
  }
}

// Grid-stride over columns (Blocks caps the grid).
__global__ void SumChunksKernel(const float* partial, int64_t chunks, int64_t width, float* out) {
  for (int64_t column = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; column < width;
       column += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float total = 0.f;
    for (int64_t c = 0; c < chunks; ++c) total += partial[c * width + column];
    out[column] = total;
  }
}

// Block (dim / 2 / N, heads a block, tokens a block); thread x rotates elements [d, d + N) with
// [d + dim/2, d + dim/2 + N) of its token's heads.
template <int N, typename In, typename Out>
__global__ void RopeKernel(const In* x, const float* cos, const float* sin, RopeShape shape,
                           bool transposed, Out* out) {
  const int64_t token = blockIdx.x * static_cast<int64_t>(blockDim.z) + threadIdx.z;
  if (token >= shape.batch * shape.tokens) return;
  const int64_t b = token / shape.tokens, t = token % shape.tokens;
  const int64_t half = shape.dim / 2, d = threadIdx.x * static_cast<int64_t>(N);
  const int64_t table = b * shape.table_strides[0] + t * shape.table_strides[1] + d;
  const Pack<float, N> cos_d = LoadPack<N>(cos + table), cos_e = LoadPack<N>(cos + table + half);
  const Pack<float, N> sin_d = LoadPack<N>(sin + table), sin_e = LoadPack<N>(sin + table + half);
  for (int64_t h = threadIdx.y; h < shape.heads; h += blockDim.y) {
    const In* row = x + b * shape.x_strides[0] + t * shape.x_strides[1] + h * shape.x_strides[2];
    const Pack<In, N> xd = LoadPack<N>(row + d), xe = LoadPack<N>(row + d + half);
    Pack<Out, N> yd, ye;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const float a = ToFloat(xd.v[k]), e = ToFloat(xe.v[k]);
      // With e = d + dim/2, forward: y_d = x_d cos_d - x_e sin_d, y_e = x_e cos_e + x_d sin_e.
      // Transposed: y_d = x_d cos_d + x_e sin_e, y_e = x_e cos_e - x_d sin_d.
      const float first =
          transposed ? a * cos_d.v[k] + e * sin_e.v[k] : a * cos_d.v[k] - e * sin_d.v[k];
      const float second =
          transposed ? e * cos_e.v[k] - a * sin_d.v[k] : e * cos_e.v[k] + a * sin_e.v[k];
      yd.v[k] = FromFloat<Out>(first);
      ye.v[k] = FromFloat<Out>(second);
    }
    Out* o = out + (token * shape.heads + h) * shape.dim;
    StorePack<N>(o + d, yd);
    StorePack<N>(o + d + half, ye);
  }
}

}  // namespace

void SwiGluForward(const void* gate, const void* up, ElementType in, void* out,
                   ElementType out_type, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  Dispatch(in, [&](auto in_tag) {
    using In = decltype(in_tag);
    DispatchNarrow(out_type, [&](auto out_tag) {
      using Out = decltype(out_tag);
      const auto fits = [&](int pack) {
        return PackAligned(gate, pack, sizeof(In)) && PackAligned(up, pack, sizeof(In)) &&
               PackAligned(out, pack, sizeof(Out));
      };
      DispatchPack(fits, [&](auto pack) {
        SwiGluForwardKernel<pack(), In, Out><<<Blocks(n / pack()), kThreads, 0, stream>>>(
            static_cast<const In*>(gate), static_cast<const In*>(up), static_cast<Out*>(out), n);
      });
    });
  });
  Check(cudaGetLastError());
}

void SwiGluBackward(const void* grad, ElementType grad_type, const void* gate, const void* up,
                    ElementType in, void* grad_gate, void* grad_up, int64_t n,
                    cudaStream_t stream) {
  if (n == 0) return;
  DispatchNarrow(grad_type, [&](auto grad_tag) {
    using Grad = decltype(grad_tag);
    Dispatch(in, [&](auto in_tag) {
      using In = decltype(in_tag);
      const auto fits = [&](int pack) {
        return PackAligned(grad, pack, sizeof(Grad)) && PackAligned(gate, pack, sizeof(In)) &&
               PackAligned(up, pack, sizeof(In)) && PackAligned(grad_gate, pack, sizeof(In)) &&
               PackAligned(grad_up, pack, sizeof(In));
      };
      DispatchPack(fits, [&](auto pack) {
        SwiGluBackwardKernel<pack(), Grad, In><<<Blocks(n / pack()), kThreads, 0, stream>>>(
            static_cast<const Grad*>(grad), static_cast<const In*>(gate),
            static_cast<const In*>(up), static_cast<In*>(grad_gate), static_cast<In*>(grad_up), n);
      });
    });
  });
  Check(cudaGetLastError());
}

void RmsNormRows(const RmsNormInputs& in, cudaStream_t stream) {
  if (in.rows == 0 || in.width == 0) return;
  Dispatch(in.delta_type, [&](auto delta_tag) {
    using Delta = decltype(delta_tag);
    DispatchNarrow(in.out_type, [&](auto out_tag) {
      using Out = decltype(out_tag);
      // Every row starts aligned when the width is a multiple of the pack.
      const auto fits = [&](int pack) {
        return pack <= 4 && in.width % pack == 0 && PackAligned(in.x, pack, sizeof(float)) &&
               PackAligned(in.weight, pack, sizeof(float)) &&
               PackAligned(in.y, pack, sizeof(Out)) &&
               (in.delta == nullptr || (PackAligned(in.delta, pack, sizeof(Delta)) &&
                                        PackAligned(in.sum, pack, sizeof(float))));
      };
      const int64_t rows_a_block = kThreads / kWarp;
      DispatchPack(fits, [&](auto pack) {
        RmsNormRowsKernel<pack(), Delta, Out>
            <<<static_cast<unsigned>((in.rows + rows_a_block - 1) / rows_a_block), kThreads, 0,
               stream>>>(in.x, static_cast<const Delta*>(in.delta), in.sum, in.weight, in.rows,
                         in.width, in.eps, static_cast<Out*>(in.y), in.rstd);
      });
    });
  });
  Check(cudaGetLastError());
}

int64_t RmsNormBackwardWorkspace(int64_t rows, int64_t width) {
  return (rows + NormChunkRows(rows) - 1) / NormChunkRows(rows) * width;
}

void RmsNormBackward(const RmsNormGradients& in, cudaStream_t stream) {
  const int64_t rows = in.rows, width = in.width;
  if (width == 0) return;
  if (rows == 0) {
    if (in.grad_weight != nullptr) {
      Check(cudaMemsetAsync(in.grad_weight, 0, width * sizeof(float), stream));
    }
    return;
  }
  Dispatch(in.grad_type, [&](auto grad_tag) {
    using Grad = decltype(grad_tag);
    const Grad* grad = static_cast<const Grad*>(in.grad);
    Dispatch(in.narrow_type, [&](auto narrow_tag) {
      using Narrow = decltype(narrow_tag);
      const auto fits = [&](int pack) {
        const auto fit = [&](const void* p, int bytes) {
          return p == nullptr || PackAligned(p, pack, bytes);
        };
        return pack <= 4 && width % pack == 0 && fit(grad, sizeof(Grad)) &&
               fit(in.x, sizeof(float)) && fit(in.weight, sizeof(float)) &&
               fit(in.through, sizeof(float)) && fit(in.grad_x, sizeof(float)) &&
               fit(in.grad_x_narrow, sizeof(Narrow));
      };
      DispatchPack(fits, [&](auto pack) {
        if (in.grad_x != nullptr || in.grad_x_narrow != nullptr) {
          const int64_t rows_a_block = kThreads / kWarp;
          RmsNormGradInputKernel<pack(), Grad, Narrow>
              <<<static_cast<unsigned>((rows + rows_a_block - 1) / rows_a_block), kThreads, 0,
                 stream>>>(grad, in.x, in.weight, in.rstd, rows, width, in.through, in.grad_x,
                           static_cast<Narrow*>(in.grad_x_narrow));
        }
        if (in.grad_weight != nullptr) {
          const int64_t columns_a_block = kWarp * pack();
          const int64_t chunk_rows = NormChunkRows(rows);
          const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
          const dim3 grid(static_cast<unsigned>((width + columns_a_block - 1) / columns_a_block),
                          static_cast<unsigned>(chunks));
          RmsNormGradWeightKernel<pack(), Grad><<<grid, kThreads, 0, stream>>>(
              grad, in.x, in.rstd, rows, width, chunk_rows, in.workspace);
          SumChunksKernel<<<Blocks(width), kThreads, 0, stream>>>(in.workspace, chunks, width,
                                                                  in.grad_weight);
        }
      });
    });
  });
  Check(cudaGetLastError());
}

void Rope(const void* x, ElementType x_type, const float* cos, const float* sin,
          const RopeShape& shape, bool transposed, void* out, ElementType out_type,
          cudaStream_t stream) {
  const int64_t token_rows = shape.batch * shape.tokens;
  if (token_rows == 0 || shape.heads == 0 || shape.dim == 0) return;
  const int64_t half = shape.dim / 2;
  Dispatch(x_type, [&](auto in_tag) {
    using In = decltype(in_tag);
    Dispatch(out_type, [&](auto out_tag) {
      using Out = decltype(out_tag);
      // A stride counts only along a dimension of more than one index.
      const auto strides_fit = [](int pack, const int64_t* strides, const int64_t* sizes,
                                  int count) {
        for (int i = 0; i < count; ++i) {
          if (sizes[i] > 1 && strides[i] % pack != 0) return false;
        }
        return true;
      };
      const int64_t x_sizes[3] = {shape.batch, shape.tokens, shape.heads};
      const auto fits = [&](int pack) {
        return half % pack == 0 && PackAligned(x, pack, sizeof(In)) &&
               PackAligned(out, pack, sizeof(Out)) && PackAligned(cos, pack, sizeof(float)) &&
               PackAligned(sin, pack, sizeof(float)) &&
               strides_fit(pack, shape.x_strides, x_sizes, 3) &&
               strides_fit(pack, shape.table_strides, x_sizes, 2);
      };
      DispatchPack(fits, [&](auto pack) {
        const int64_t pairs = half / pack();
        // About kThreads threads a block: a token's heads, then several tokens.
        const int64_t heads = std::clamp<int64_t>(kThreads / pairs, 1, shape.heads);
        constexpr int64_t kMaxBlockZ = 64;  // CUDA's limit on blockDim.z
        const int64_t tokens = std::clamp<int64_t>(kThreads / (pairs * heads), 1, kMaxBlockZ);
        const dim3 block(static_cast<unsigned>(pairs), static_cast<unsigned>(heads),
                         static_cast<unsigned>(tokens));
        RopeKernel<pack(), In, Out>
            <<<static_cast<unsigned>((token_rows + tokens - 1) / tokens), block, 0, stream>>>(
                static_cast<const In*>(x), cos, sin, shape, transposed, static_cast<Out*>(out));
      });
    });
  });
  Check(cudaGetLastError());
}

}  // namespace rlhfd::model::kernels
