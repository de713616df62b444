#include "worker/rollout/prefill_inputs.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace rlhfd::rollout {

PrefillInputs MakePrefillInputs(const std::vector<PrefillRow>& rows, int64_t block_size,
                                int64_t scratch_block, int64_t max_blocks) {
  const int64_t batch = static_cast<int64_t>(rows.size());
  int64_t longest = 0, longest_context = 0;
  bool any_cached = false;
  for (const PrefillRow& row : rows) {
    const int64_t length = static_cast<int64_t>(row.context.size());
    longest = std::max(longest, length - row.cached);
    longest_context = std::max(longest_context, length);
    any_cached |= row.cached > 0;
  }
  PrefillInputs inputs{.ids = at::zeros({batch, longest}, at::kLong),
                       .mask = at::zeros({batch, longest}, at::kLong),
                       .cache_rows = at::empty({batch, longest}, at::kLong),
                       .last_index = at::empty({batch}, at::kLong)};
  if (any_cached) {
    inputs.past =
        PrefillPast{.block_tables = at::full({batch, max_blocks}, scratch_block, at::kLong),
                    .used_blocks = (longest_context + block_size - 1) / block_size,
                    .positions = at::empty({batch, longest}, at::kLong),
                    .lengths = at::empty({batch}, at::kLong)};
  }
  for (int64_t b = 0; b < batch; ++b) {
    const PrefillRow& row = rows[b];
    const int64_t length = static_cast<int64_t>(row.context.size()), fresh = length - row.cached;
    inputs.ragged |= fresh != longest;
    inputs.tokens += fresh;
    std::copy(row.context.begin() + row.cached, row.context.end(),
              inputs.ids.data_ptr<int64_t>() + b * longest);
    std::fill_n(inputs.mask.data_ptr<int64_t>() + b * longest, fresh, 1);
    inputs.last_index.data_ptr<int64_t>()[b] = fresh - 1;
    int64_t* cache_rows = inputs.cache_rows.data_ptr<int64_t>() + b * longest;
    for (int64_t t = 0; t < longest; ++t) {
      const int64_t position = row.cached + t;
      const int64_t block = t < fresh ? row.blocks[position / block_size] : scratch_block;
      cache_rows[t] = block * block_size + position % block_size;
      if (inputs.past) inputs.past->positions.data_ptr<int64_t>()[b * longest + t] = position;
    }
    if (inputs.past) {
      std::copy(row.blocks.begin(), row.blocks.end(),
                inputs.past->block_tables.data_ptr<int64_t>() + b * max_blocks);
      inputs.past->lengths.data_ptr<int64_t>()[b] = length;
    }
  }
  return inputs;
}

}  // namespace rlhfd::rollout
