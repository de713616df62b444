// Attention of one new token per sequence over that sequence's blocks in a PagedKvCache.
#pragma once

#include <ATen/Tensor.h>

namespace rlhfd::rollout {

// q (B, H, 1, D); k_cache / v_cache (blocks, K, block_size, D); block_tables (B, max_blocks)
// int64, row b naming sequence b's blocks in order; positions (B) int64, where positions[b] is
// the new token's position (keys 0..positions[b] are attended). Returns (B, H, 1, D). On CUDA
// with bf16, head dim 64 or 128, at most 16 query heads per key/value head, a block size that is
// a multiple of 32 and 16-byte aligned data, our kernel runs (a failed launch throws); otherwise
// DecodeAttentionReference.
at::Tensor DecodeAttention(const at::Tensor& q, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& block_tables,
                           const at::Tensor& positions);

// The same with ATen's scaled_dot_product_attention over the gathered blocks and a length mask.
at::Tensor DecodeAttentionReference(const at::Tensor& q, const at::Tensor& k_cache,
                                    const at::Tensor& v_cache, const at::Tensor& block_tables,
                                    const at::Tensor& positions);

// Attention of T tokens per sequence whose keys and values are in the cache already, over the
// sequence's earlier positions too (a prefill after a cached prefix): q (B, H, T, D) at
// `query_positions` (B, T) int64; sequence b's keys are positions 0 … lengths[b] - 1 of its row
// of `block_tables`, of which the first `used_blocks` are read. A query attends the keys at its
// position and before. Returns (B, H, T, D). ATen's attention over the gathered blocks.
at::Tensor PagedAttention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const at::Tensor& block_tables, int64_t used_blocks,
                          const at::Tensor& query_positions, const at::Tensor& lengths);

}  // namespace rlhfd::rollout
