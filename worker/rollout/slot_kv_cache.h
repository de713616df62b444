// The rollout engine's KV cache: a fixed number of slots, each holding one sequence's keys and
// values up to `capacity` positions. Allocated once for the engine's lifetime (never per step);
// sequences take a free slot when admitted and give it back when they finish.
#pragma once

#include <ATen/Tensor.h>

#include <vector>

#include "worker/model/transformer.h"

namespace rlhfd::rollout {

class SlotKvCache : public model::AttentionCache {
 public:
  SlotKvCache(const model::ModelConfig& config, int64_t slots, int64_t capacity,
              at::TensorOptions options);

  // Bytes one slot takes: keys and values of every layer at full capacity.
  static int64_t BytesPerSlot(const model::ModelConfig& config, int64_t capacity,
                              at::ScalarType dtype);

  int64_t slots() const { return slots_; }
  int64_t capacity() const { return capacity_; }
  at::Tensor& key(int64_t layer) { return keys_[layer]; }  // (slots, K, capacity, D)
  at::Tensor& value(int64_t layer) { return values_[layer]; }

  // The next forward is a prefill of whole prompts (right-padded), row b written to slot
  // slots[b] from position 0.
  void BeginPrefill(const at::Tensor& slots);
  // The next forward decodes one token per row, written at positions[b] of slot slots[b].
  void BeginDecode(const at::Tensor& slots, const at::Tensor& positions);
  // Copies positions [0, length) of slots `from` (M) to slots `to` (M): the n samples of a prompt
  // start from one prefill.
  void CopyPrefix(const at::Tensor& from, const at::Tensor& to, int64_t length);

  int64_t past_length() const override { return 0; }
  at::Tensor Attend(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& mask) override;
  void Advance(int64_t tokens) override {}

 private:
  enum class Mode { kNone, kPrefill, kDecode };
  std::vector<at::Tensor> keys_;  // Per layer (slots, K, capacity, D).
  std::vector<at::Tensor> values_;
  int64_t slots_, capacity_;
  Mode mode_ = Mode::kNone;
  at::Tensor slot_ids_, positions_;
};

}  // namespace rlhfd::rollout
