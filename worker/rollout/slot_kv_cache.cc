#include "worker/rollout/slot_kv_cache.h"

#include <ATen/ATen.h>

#include "worker/rollout/decode_attention.h"

namespace rlhfd::rollout {

SlotKvCache::SlotKvCache(const model::ModelConfig& config, int64_t slots, int64_t capacity,
                         at::TensorOptions options)
    : slots_(slots), capacity_(capacity) {
  for (int64_t i = 0; i < config.num_layers; ++i) {
    keys_.push_back(at::zeros({slots, config.num_kv_heads, capacity, config.head_dim}, options));
    values_.push_back(at::zeros({slots, config.num_kv_heads, capacity, config.head_dim}, options));
  }
}

int64_t SlotKvCache::BytesPerSlot(const model::ModelConfig& config, int64_t capacity,
                                  at::ScalarType dtype) {
  return 2 * config.num_layers * config.num_kv_heads * capacity * config.head_dim *
         static_cast<int64_t>(c10::elementSize(dtype));
}

void SlotKvCache::BeginPrefill(const at::Tensor& slots) {
  mode_ = Mode::kPrefill;
  slot_ids_ = slots;
  positions_ = at::Tensor();
}

void SlotKvCache::BeginDecode(const at::Tensor& slots, const at::Tensor& positions) {
  mode_ = Mode::kDecode;
  slot_ids_ = slots;
  positions_ = positions;
}

void SlotKvCache::CopyPrefix(const at::Tensor& from, const at::Tensor& to, int64_t length) {
  for (std::vector<at::Tensor>* store : {&keys_, &values_}) {
    for (at::Tensor& layer : *store) {
      at::Tensor prefix = layer.narrow(2, 0, length);
      prefix.index_copy_(0, to, prefix.index_select(0, from));
    }
  }
}

at::Tensor SlotKvCache::Attend(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& mask) {
  TORCH_CHECK(mode_ != Mode::kNone, "SlotKvCache: forward without BeginPrefill/BeginDecode");
  if (mode_ == Mode::kPrefill) {
    const int64_t t = k.size(2);
    TORCH_CHECK(t <= capacity_, "SlotKvCache: prompt longer than the slot capacity");
    keys_[layer].narrow(2, 0, t).index_copy_(0, slot_ids_, k);
    values_[layer].narrow(2, 0, t).index_copy_(0, slot_ids_, v);
    return model::ScaledDotProductAttention(q, k, v, mask);
  }
  // k, v (B, K, 1, D) land at [slot, :, position].
  using at::indexing::Slice;
  keys_[layer].index_put_({slot_ids_, Slice(), positions_}, k.select(2, 0));
  values_[layer].index_put_({slot_ids_, Slice(), positions_}, v.select(2, 0));
  return DecodeAttention(q, keys_[layer], values_[layer], slot_ids_, positions_);
}

}  // namespace rlhfd::rollout
