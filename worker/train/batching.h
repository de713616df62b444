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
// in order. With `group` > 1 the runs of `group` consecutive entries of `rows` (a prompt's
// samples, which a packed forward computes the prompt of once) are filled as one where their
// sum fits the budget, row by row where not; rows that do not divide into runs, row by row.
std::vector<std::vector<int64_t>> SplitMicroBatches(const std::vector<int64_t>& rows,
                                                    const std::vector<int64_t>& tokens,
                                                    int64_t rows_per_micro_batch,
                                                    int64_t token_budget, int64_t group = 1);

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

// How a micro-batch's rows become one packed sequence, worked out on the host. A row that begins
// with the same tokens as an earlier row of the micro-batch (the n samples of one GRPO prompt)
// computes that prefix once: its own tokens start after it, read the earlier row's keys and
// values for it, and its positions in it are scored from the earlier row's hidden states. With
// causal attention a prefix's states depend on the prefix alone, so this changes only rounding
// (the order of float sums in the backward; in bf16 the attention kernel's blocking).
struct PackedRows {
  std::vector<int64_t> tokens;         // flat (n * T) index of each packed (computed) token
  std::vector<int64_t> positions;      // each packed token's position in its row
  std::vector<int64_t> starts;         // where each row's own tokens start (n + 1)
  std::vector<int64_t> key_index;      // each row's tokens 0, 1, … as packed tokens; empty: none
  std::vector<int64_t> key_starts;     // where each row's keys start in key_index (n + 1)
  std::vector<int64_t> scored;         // the packed token whose hidden state scores each position
  std::vector<int64_t> targets;        // flat (n * T) index of the token each position predicts
  std::vector<int64_t> rows, columns;  // where each lands in (n, T - 1)
  int64_t max_length = 0;              // the most own tokens of a row
  int64_t max_keys = 0;                // the longest row
};

// The shortest common prefix computed once (shorter ones are not worth a row's key gather).
inline constexpr int64_t kMinSharedPrefix = 16;

// ids and real (n, T) row-major on the host (ids may be null where `share` is false); scored
// (n, T - 1) or null: positions to score where their next token is real (null: all of them).
// The real tokens of a row are taken in column order as one sequence.
PackedRows PlanPackedRows(const int64_t* ids, const bool* real, const bool* scored, int64_t n,
                          int64_t t, bool share);

struct MicroBatchForward {
  // Pack rows even where the model has no variable-length attention kernel (tests of it).
  bool packed = false;
  // (n, T - 1), any dtype: the positions a loss reads (non-zero), such as the response mask;
  // undefined: all. The others are not scored (no LM head, no log-prob for prompt tokens).
  at::Tensor scored;
  // Compute a prefix shared by rows once (PackedRows), where rows are packed.
  bool share_prefixes = true;
};

// Runs `model` over ids (n, T) with attention_mask (n, T) (1 = token; undefined = all tokens).
// Padded: one (n, T) forward. Packed: the rows' real tokens (contiguous, left or right padding)
// concatenated into one sequence with cu_seqlens, so no padding token is computed, and shared
// prefixes computed once; only positions whose next token is real are returned. Rows are packed
// when `packed` asks or the model packs through the variable-length attention kernel where it
// runs (a GPU in bf16 / fp16); elsewhere packed attention is a masked kernel quadratic in the
// packed length, which an H200 measured slower than padding (docs/PERFORMANCE.md).
ScoredPositions ForwardMicroBatch(model::Transformer& model, const at::Tensor& ids,
                                  const at::Tensor& attention_mask,
                                  const MicroBatchForward& how = {});

}  // namespace rlhfd::train
