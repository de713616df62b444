// A prefill forward's inputs over the paged KV cache, made on the host: each row's new tokens
// (those after its cached prefix) right-padded, the cache row each token's key and value go to
// (padding to the scratch block), and, when any row follows a cached prefix, what the rows
// attend before their new tokens (PrefillPast).
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "worker/rollout/paged_kv_cache.h"

namespace rlhfd::rollout {

struct PrefillRow {
  std::span<const int64_t> context;  // The whole context: prompt and tokens so far.
  int64_t cached = 0;                // Its first positions, whose keys and values are cached.
  std::span<const int64_t> blocks;   // Its blocks, in position order, covering the context.
};

struct PrefillInputs {
  at::Tensor ids, mask, cache_rows;  // (B, T) int64: new tokens, 1 where real, cache rows.
  at::Tensor last_index;             // (B) int64: each row's last new token.
  std::optional<PrefillPast> past;   // When a row has a cached prefix.
  bool ragged = false;               // Rows of unequal lengths (padding to mask).
  int64_t tokens = 0;                // New tokens, padding not counted.
};

PrefillInputs MakePrefillInputs(const std::vector<PrefillRow>& rows, int64_t block_size,
                                int64_t scratch_block, int64_t max_blocks);

}  // namespace rlhfd::rollout
