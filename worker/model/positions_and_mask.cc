// Positions and attention masks of a forward's batch; see positions_and_mask.h.
#include "worker/model/positions_and_mask.h"

#include <ATen/ATen.h>

namespace rlhfd::model {
namespace {

// Default positions: the index among the sequence's real tokens (so left padding works), offset
// by what the cache already holds.
at::Tensor DefaultPositions(const ForwardBatch& batch, int64_t past, int64_t tokens) {
  const auto options = at::TensorOptions().dtype(at::kLong).device(batch.input_ids.device());
  if (!batch.attention_mask.defined()) {
    return at::arange(past, past + tokens, options)
        .unsqueeze(0)
        .expand({batch.input_ids.size(0), tokens});
  }
  at::Tensor mask = batch.attention_mask.to(at::kLong);
  at::Tensor positions = (mask.cumsum(1) - 1).clamp_min(0);
  return positions.narrow(1, positions.size(1) - tokens, tokens);
}

}  // namespace

std::pair<at::Tensor, at::Tensor> PositionsAndMask(const ForwardBatch& batch, int64_t past,
                                                   bool varlen) {
  const at::Tensor& ids = batch.input_ids;  // (B, T)
  const int64_t b = ids.size(0), t = ids.size(1), s = past + t;
  const auto long_options = at::TensorOptions().dtype(at::kLong).device(ids.device());
  at::Tensor positions = batch.position_ids;
  if (!batch.attention_mask.defined() && !batch.cu_seqlens.defined() && past == 0) {
    if (!positions.defined()) positions = DefaultPositions(batch, past, t);
    return {positions, at::Tensor()};
  }
  // Packed: sequence id of each token; attention within a sequence; positions restart.
  at::Tensor sequence;
  if (batch.cu_seqlens.defined()) {
    at::Tensor starts = batch.cu_seqlens.to(long_options.device()).to(at::kLong);
    at::Tensor token = at::arange(0, t, long_options);
    sequence = at::searchsorted(starts, token, /*out_int32=*/false, /*right=*/true) - 1;
    if (!positions.defined()) positions = (token - starts.index_select(0, sequence)).unsqueeze(0);
    if (varlen) return {positions, at::Tensor()};  // no (T, T) mask is ever made
  }
  at::Tensor allowed;  // (B, T, S) bool
  at::Tensor query_index = at::arange(past, s, long_options).view({t, 1});
  at::Tensor key_index = at::arange(0, s, long_options).view({1, s});
  const auto causal = [&] { return (key_index <= query_index).unsqueeze(0); };  // (1, T, S)
  if (batch.key_index.defined()) {
    // A query at position p of sequence q may read the packed tokens its sequence's keys 0..p
    // name: (T, K) over the key list, then summed onto the packed tokens they name.
    const at::Tensor key_starts = batch.key_cu_seqlens.to(ids.device(), at::kLong);
    const at::Tensor key = at::arange(batch.key_index.size(0), long_options);
    const at::Tensor key_sequence =
        at::searchsorted(key_starts, key, /*out_int32=*/false, /*right=*/true) - 1;
    const at::Tensor key_position = key - key_starts.index_select(0, key_sequence);
    const at::Tensor query_position = positions.view({t, 1});
    const at::Tensor reads = (sequence.view({t, 1}) == key_sequence.view({1, -1}))
                                 .logical_and(key_position.view({1, -1}) <= query_position);
    allowed = at::zeros({t, t}, at::TensorOptions().dtype(at::kFloat).device(ids.device()))
                  .index_add_(1, batch.key_index.to(ids.device()), reads.to(at::kFloat))
                  .gt(0)
                  .unsqueeze(0);
  } else if (batch.cu_seqlens.defined()) {
    allowed = causal().logical_and(sequence.view({t, 1}) == sequence.view({1, t}));
  } else {
    if (!positions.defined()) positions = DefaultPositions(batch, past, t);
    allowed = causal().expand({b, t, s});
    if (batch.attention_mask.defined()) {
      at::Tensor key_valid = batch.attention_mask.to(at::kBool);  // (B, S) or (B, T)
      if (key_valid.size(1) == t && past > 0) {
        key_valid = at::cat({at::ones({b, past}, key_valid.options()), key_valid}, 1);
      }
      allowed = allowed.logical_and(key_valid.unsqueeze(1));
    }
  }
  // Every query may see itself, so rows of padding never become all-masked (NaN).
  allowed = allowed.logical_or((key_index == query_index).unsqueeze(0));
  return {positions, allowed.unsqueeze(1)};
}

}  // namespace rlhfd::model
