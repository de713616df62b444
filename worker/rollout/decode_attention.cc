#include "worker/rollout/decode_attention.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>

#include "worker/model/transformer.h"
#if RLHFD_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>

#include "worker/rollout/kernels.h"
#endif

namespace rlhfd::rollout {

at::Tensor PagedAttention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const at::Tensor& block_tables, int64_t used_blocks,
                          const at::Tensor& query_positions, const at::Tensor& lengths) {
  const int64_t batch = block_tables.size(0);
  const int64_t kv_heads = k_cache.size(1), block_size = k_cache.size(2), d = k_cache.size(3);
  const int64_t capacity = used_blocks * block_size;
  const at::Tensor tables = block_tables.narrow(1, 0, used_blocks);
  // (B · used_blocks, K, block_size, D) → (B, K, capacity, D): each sequence's positions in order.
  const auto gather = [&](const at::Tensor& cache) {
    return cache.index_select(0, tables.reshape({-1}))
        .view({batch, used_blocks, kv_heads, block_size, d})
        .transpose(1, 2)
        .reshape({batch, kv_heads, capacity, d});
  };
  const at::Tensor key_index = at::arange(capacity, query_positions.options()).view({1, 1, -1});
  const at::Tensor allowed = (key_index <= query_positions.unsqueeze(2))
                                 .logical_and(key_index < lengths.view({-1, 1, 1}));  // (B, T, S)
  at::Tensor keys = gather(k_cache), values = gather(v_cache);
  if (q.is_cuda() && q.size(1) != kv_heads) {
    // Each query head its key/value head's copy: with a mask and grouped heads ATen's attention
    // falls back to its math kernel, which holds all B·H·T·S scores; with as many key/value
    // heads as query heads its memory-efficient kernel can take the mask.
    keys = keys.repeat_interleave(q.size(1) / kv_heads, 1);
    values = values.repeat_interleave(q.size(1) / kv_heads, 1);
  }
  return model::ScaledDotProductAttention(q, keys, values, allowed.unsqueeze(1));
}

at::Tensor DecodeAttentionReference(const at::Tensor& q, const at::Tensor& k_cache,
                                    const at::Tensor& v_cache, const at::Tensor& block_tables,
                                    const at::Tensor& positions) {
  return PagedAttention(q, k_cache, v_cache, block_tables, block_tables.size(1),
                        positions.unsqueeze(1), positions + 1);
}

at::Tensor DecodeAttention(const at::Tensor& q, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& block_tables,
                           const at::Tensor& positions) {
#if RLHFD_HAVE_CUDA
  const int64_t batch = q.size(0), heads = q.size(1), head_dim = q.size(3);
  // The kernel reads 16-byte pieces of q and of the cache's rows.
  const auto aligned = [](const at::Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  };
  const bool supported = q.is_cuda() && q.scalar_type() == at::kBFloat16 &&
                         k_cache.scalar_type() == at::kBFloat16 && k_cache.is_contiguous() &&
                         v_cache.is_contiguous() && aligned(k_cache) && aligned(v_cache) &&
                         q.size(2) == 1 && block_tables.scalar_type() == at::kLong &&
                         positions.scalar_type() == at::kLong;
  const at::Tensor query = supported ? q.contiguous() : q;
  const int64_t block_size = k_cache.size(2), max_blocks = block_tables.size(1);
  if (supported && aligned(query) &&
      kernels::DecodeAttentionServes(static_cast<int>(heads), static_cast<int>(k_cache.size(1)),
                                     static_cast<int>(head_dim), static_cast<int>(max_blocks),
                                     static_cast<int>(block_size))) {
    const at::Tensor tables = block_tables.contiguous(), new_positions = positions.contiguous();
    at::Tensor out = at::empty_like(query);
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    const at::Tensor workspace =
        at::empty({kernels::DecodeAttentionWorkspaceBytes(
                      static_cast<int>(batch), static_cast<int>(heads), static_cast<int>(head_dim),
                      static_cast<int>(max_blocks * block_size))},
                  q.options().dtype(at::kByte));
    // A shape the kernel serves whose launch fails is an error, not a reason to fall back.
    TORCH_CHECK(
        kernels::DecodeAttention(
            query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr<int64_t>(),
            new_positions.data_ptr<int64_t>(), out.data_ptr(), workspace.data_ptr(),
            static_cast<int>(batch), static_cast<int>(heads), static_cast<int>(k_cache.size(1)),
            static_cast<int>(head_dim), static_cast<int>(max_blocks), static_cast<int>(block_size),
            scale, c10::cuda::getCurrentCUDAStream(q.device().index())),
        "the decode-attention kernel did not launch for ", batch, " rows of ", heads, " heads");
    return out;
  }
#endif
  return DecodeAttentionReference(q, k_cache, v_cache, block_tables, positions);
}

}  // namespace rlhfd::rollout
