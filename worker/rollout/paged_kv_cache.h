// The rollout engine's KV cache, paged: per layer a pool of blocks of `block_size` positions, each
// sequence's keys and values in the blocks its row of a block table names (block j holds
// positions j·block_size … (j + 1)·block_size − 1), so memory follows the sequences' actual
// lengths. Allocated once for the engine's lifetime; which blocks a sequence holds is the
// scheduler's (BlockPool). The last block is scratch: padding rows and table entries past a
// sequence's blocks point there.
#pragma once

#include <ATen/Tensor.h>

#include <optional>
#include <vector>

#include "worker/model/transformer.h"

namespace rlhfd::rollout {

// What a prefill's sequences hold in the cache before it (cached prefixes): each row's block
// table (B, max_blocks) int64, of which the first `used_blocks` hold its positions; the new
// tokens' positions (B, T) int64; and each row's whole length (B) int64, cached and new tokens.
struct PrefillPast {
  at::Tensor block_tables;
  int64_t used_blocks = 0;
  at::Tensor positions;
  at::Tensor lengths;
};

class PagedKvCache : public model::AttentionCache {
 public:
  // `block_size`: a multiple of 32 (the decode-attention kernel reads 32 keys of one block at a
  // time).
  PagedKvCache(const model::ModelConfig& config, int64_t blocks, int64_t block_size,
               at::TensorOptions options);

  // Bytes one block takes: keys and values of every layer.
  static int64_t BytesPerBlock(const model::ModelConfig& config, int64_t block_size,
                               at::ScalarType dtype);
  // Where each position lives: `block_tables` (B, max_blocks) int64, `positions` (B) or (B, T)
  // int64 → the cache row block · block_size + offset of each position, shaped as `positions`.
  static at::Tensor CacheRows(const at::Tensor& block_tables, const at::Tensor& positions,
                              int64_t block_size);

  int64_t blocks() const { return blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t scratch_block() const { return blocks_ - 1; }
  at::Tensor& key(int64_t layer) { return keys_[layer]; }  // (blocks, K, block_size, D)
  at::Tensor& value(int64_t layer) { return values_[layer]; }

  // The next forward is a prefill (B, T): token (b, t)'s key and value go to cache row
  // cache_rows[b][t] (int64, on the cache's device). With `past`, the tokens follow cached
  // prefixes and attend them too; without, they are whole prompts.
  void BeginPrefill(const at::Tensor& cache_rows, std::optional<PrefillPast> past = std::nullopt);
  // The next forward decodes one token per row at positions[b] of the sequence whose blocks are
  // row b of `block_tables` (B, max_blocks); it attends positions 0 … positions[b].
  void BeginDecode(const at::Tensor& block_tables, const at::Tensor& positions);
  // Copies whole blocks `from` (M) to `to` (M): a sample's own copy of its prompt's last,
  // partly filled block.
  void CopyBlocks(const at::Tensor& from, const at::Tensor& to);

  int64_t past_length() const override { return 0; }
  at::Tensor Attend(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& mask) override;
  void Advance(int64_t tokens) override {}

 private:
  // Writes keys and values (N, K, D) at cache rows `rows` (N).
  void Write(int64_t layer, const at::Tensor& rows, const at::Tensor& k, const at::Tensor& v);

  enum class Mode { kNone, kPrefill, kDecode };
  std::vector<at::Tensor> keys_;  // Per layer (blocks, K, block_size, D).
  std::vector<at::Tensor> values_;
  int64_t blocks_, block_size_;
  Mode mode_ = Mode::kNone;
  at::Tensor cache_rows_, block_tables_, positions_;
  std::optional<PrefillPast> past_;
};

}  // namespace rlhfd::rollout
