// How the actor and critic updates cut a mini-batch into micro-batches and run one forward:
// a fixed number of rows, or rows packed up to a token budget (verl's use_dynamic_bsz with
// ppo_max_token_len_per_gpu); padded rows, or packed variable-length sequences with no padding
// tokens computed.
//
// Shapes: n = rows of a micro-batch, T = tokens per row (padded), C = hidden. Position p of a row
// predicts token p + 1, so per-token training tensors are (n, T-1).
#pragma once

#include <ATen/Tensor.h>

#include <vector>

#include "worker/model/transformer.h"

namespace rlhfd::train {

// Splits `rows` (indices into the batch) into micro-batches. With token_budget > 0 each holds
// rows whose token counts (tokens[row]) sum to at most the budget, filled first-fit by decreasing
// count (a row longer than the budget goes alone); otherwise `rows_per_micro_batch` rows each,
// in order.
std::vector<std::vector<int64_t>> SplitMicroBatches(const std::vector<int64_t>& rows,
                                                    const std::vector<int64_t>& tokens,
                                                    int64_t rows_per_micro_batch,
                                                    int64_t token_budget);

// The final hidden states of a micro-batch at every position that predicts a token.
struct ScoredPositions {
  at::Tensor hidden;   // (M, C)
  at::Tensor targets;  // (M) int64: the token each position predicts
  at::Tensor row;      // (M) int64: where each lands in the (n, T-1) layout
  at::Tensor column;   // (M) int64
  int64_t rows = 0, columns = 0;

  // values (M, ...) laid out as (n, T-1, ...), zero where nothing was scored; differentiable.
  at::Tensor Unflatten(const at::Tensor& values) const;
};

// Runs `model` over ids (n, T) with attention_mask (n, T) (1 = token; undefined = all tokens).
// Padded: one (n, T) forward, all n (T-1) positions. Packed: the rows' real tokens (contiguous,
// left or right padding) concatenated into one sequence with cu_seqlens, so no padding token is
// computed; only positions whose next token is real are returned. Rows are packed when `packed`
// asks or the model packs through the variable-length attention kernel where it runs (a GPU in
// bf16 / fp16); elsewhere packed attention is a masked kernel quadratic in the packed length,
// which an H200 measured slower than padding (docs/PERFORMANCE.md).
ScoredPositions ForwardMicroBatch(model::Transformer& model, const at::Tensor& ids,
                                  const at::Tensor& attention_mask, bool packed);

}  // namespace rlhfd::train
