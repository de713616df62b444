// The positions and the attention mask of one forward's batch (Transformer::Hidden): padded
// rows, packed sequences (with keys shared between them) and a KV cache's past.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <utility>

#include "worker/model/transformer.h"

namespace rlhfd::model {

// Positions (B, T) and the attention mask (B, 1, T, S) of a batch; the mask is undefined for a
// plain causal batch (no padding, packing or cache), so SDPA can use its fused causal kernels.
// With `varlen` (packed sequences for the variable-length kernel) the mask is left undefined.
std::pair<at::Tensor, at::Tensor> PositionsAndMask(const ForwardBatch& batch, int64_t past,
                                                   bool varlen);

}  // namespace rlhfd::model
