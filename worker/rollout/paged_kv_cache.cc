#include "worker/rollout/paged_kv_cache.h"

#include <ATen/ATen.h>

#include "worker/rollout/decode_attention.h"

namespace rlhfd::rollout {

PagedKvCache::PagedKvCache(const model::ModelConfig& config, int64_t blocks, int64_t block_size,
                           at::TensorOptions options)
    : blocks_(blocks), block_size_(block_size) {
  TORCH_CHECK(block_size > 0 && block_size % 32 == 0,
              "PagedKvCache: block_size must be a positive multiple of 32, got ", block_size);
  for (int64_t i = 0; i < config.num_layers; ++i) {
    keys_.push_back(at::zeros({blocks, config.num_kv_heads, block_size, config.head_dim}, options));
    values_.push_back(
        at::zeros({blocks, config.num_kv_heads, block_size, config.head_dim}, options));
  }
}

int64_t PagedKvCache::BytesPerBlock(const model::ModelConfig& config, int64_t block_size,
                                    at::ScalarType dtype) {
  return 2 * config.num_layers * config.num_kv_heads * block_size * config.head_dim *
         static_cast<int64_t>(c10::elementSize(dtype));
}

at::Tensor PagedKvCache::CacheRows(const at::Tensor& block_tables, const at::Tensor& positions,
                                   int64_t block_size) {
  const at::Tensor index = positions.dim() == 1 ? positions.unsqueeze(1) : positions;
  const at::Tensor rows = block_tables.gather(1, at::floor_divide(index, block_size)) * block_size +
                          at::remainder(index, block_size);
  return rows.view(positions.sizes());
}

void PagedKvCache::BeginPrefill(const at::Tensor& cache_rows, std::optional<PrefillPast> past) {
  mode_ = Mode::kPrefill;
  cache_rows_ = cache_rows.reshape({-1});
  past_ = std::move(past);
}

void PagedKvCache::BeginDecode(const at::Tensor& block_tables, const at::Tensor& positions) {
  mode_ = Mode::kDecode;
  block_tables_ = block_tables;
  positions_ = positions;
  cache_rows_ = CacheRows(block_tables, positions, block_size_);
}

void PagedKvCache::CopyBlocks(const at::Tensor& from, const at::Tensor& to) {
  for (std::vector<at::Tensor>* store : {&keys_, &values_}) {
    for (at::Tensor& layer : *store) layer.index_copy_(0, to, layer.index_select(0, from));
  }
}

void PagedKvCache::Write(int64_t layer, const at::Tensor& rows, const at::Tensor& k,
                         const at::Tensor& v) {
  using at::indexing::Slice;
  const at::Tensor block = at::floor_divide(rows, block_size_);
  const at::Tensor offset = at::remainder(rows, block_size_);
  keys_[layer].index_put_({block, Slice(), offset}, k);
  values_[layer].index_put_({block, Slice(), offset}, v);
}

at::Tensor PagedKvCache::Attend(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                const at::Tensor& v, const at::Tensor& mask) {
  TORCH_CHECK(mode_ != Mode::kNone, "PagedKvCache: forward without BeginPrefill/BeginDecode");
  // k, v (B, K, T, D) → (B·T, K, D) in the order of the cache rows.
  const auto tokens = [](const at::Tensor& x) {
    return x.transpose(1, 2).reshape({-1, x.size(1), x.size(3)});
  };
  Write(layer, cache_rows_, tokens(k), tokens(v));
  if (mode_ == Mode::kPrefill && past_) {
    return PagedAttention(q, keys_[layer], values_[layer], past_->block_tables, past_->used_blocks,
                          past_->positions, past_->lengths);
  }
  if (mode_ == Mode::kPrefill) return model::ScaledDotProductAttention(q, k, v, mask);
  return DecodeAttention(q, keys_[layer], values_[layer], block_tables_, positions_);
}

}  // namespace rlhfd::rollout
