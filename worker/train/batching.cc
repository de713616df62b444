#include "worker/train/batching.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

namespace rlhfd::train {

std::vector<std::vector<int64_t>> SplitMicroBatches(const std::vector<int64_t>& rows,
                                                    const std::vector<int64_t>& tokens,
                                                    int64_t rows_per_micro_batch,
                                                    int64_t token_budget) {
  std::vector<std::vector<int64_t>> batches;
  if (token_budget <= 0) {
    const size_t step = static_cast<size_t>(std::max<int64_t>(rows_per_micro_batch, 1));
    for (size_t i = 0; i < rows.size(); i += step) {
      batches.emplace_back(rows.begin() + i, rows.begin() + std::min(rows.size(), i + step));
    }
    return batches;
  }
  std::vector<size_t> order(rows.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return tokens[rows[a]] > tokens[rows[b]]; });
  std::vector<int64_t> load;
  std::vector<std::vector<size_t>> members;  // Positions in `rows`, to keep the input order.
  for (size_t i : order) {
    const int64_t count = tokens[rows[i]];
    size_t bin = 0;
    while (bin < load.size() && load[bin] + count > token_budget) ++bin;
    if (bin == load.size()) {
      load.push_back(0);
      members.emplace_back();
    }
    load[bin] += count;
    members[bin].push_back(i);
  }
  for (auto& positions : members) {
    std::sort(positions.begin(), positions.end());
    std::vector<int64_t> batch;
    for (size_t i : positions) batch.push_back(rows[i]);
    batches.push_back(std::move(batch));
  }
  return batches;
}

at::Tensor ScoredPositions::Unflatten(const at::Tensor& values) const {
  std::vector<int64_t> shape = {rows, columns};
  for (int64_t d = 1; d < values.dim(); ++d) shape.push_back(values.size(d));
  return at::zeros(shape, values.options()).index_put({row, column}, values);
}

ScoredPositions ForwardMicroBatch(model::Transformer& model, const at::Tensor& ids,
                                  const at::Tensor& attention_mask, bool packed) {
  const int64_t n = ids.size(0), t = ids.size(1);
  const auto longs = ids.options().dtype(at::kLong);
  ScoredPositions out;
  out.rows = n;
  out.columns = t - 1;
  if (!packed && !model->PacksWithVarlenAttention(ids.device())) {
    // Without padding the mask adds nothing, and leaving it out lets attention run the fused
    // causal kernels instead of a masked one.
    const bool padded = attention_mask.defined() && attention_mask.min().item<int64_t>() == 0;
    const at::Tensor hidden =
        model->Hidden({ids, padded ? attention_mask : at::Tensor()});  // (n, T, C)
    out.hidden = hidden.narrow(1, 0, t - 1).reshape({n * (t - 1), -1});
    out.targets = ids.narrow(1, 1, t - 1).reshape({n * (t - 1)});
    out.row = at::arange(n, longs).repeat_interleave(t - 1);
    out.column = at::arange(t - 1, longs).repeat({n});
    return out;
  }
  // Packed: each row's real tokens, one after another; positions restart per sequence. Every
  // index is worked out on the host from one copy of the mask and moved to the device once,
  // before the forward, so that the host never waits for the GPU in between (a blocking copy
  // after the forward would wait for all of it).
  const at::Tensor real =
      attention_mask.defined() ? attention_mask.to(at::kBool).cpu() : at::ones({n, t}, at::kBool);
  const bool* real_data = real.contiguous().data_ptr<bool>();
  std::vector<int64_t> gather;                    // flat (n * T) index of each packed token
  std::vector<int64_t> starts = {0}, predicting;  // packed index of each scored position
  std::vector<int64_t> rows, columns;             // and where it lands in (n, T - 1)
  for (int64_t i = 0; i < n; ++i) {
    int64_t length = 0;
    for (int64_t c = 0; c < t; ++c) {
      if (!real_data[i * t + c]) continue;
      gather.push_back(i * t + c);
      ++length;
    }
    for (int64_t j = 0; j + 1 < length; ++j) {
      predicting.push_back(starts.back() + j);
      rows.push_back(i);
      columns.push_back(gather[starts.back() + j] - i * t);
    }
    starts.push_back(starts.back() + length);
  }
  if (predicting.empty()) {  // No row has two tokens: nothing to score.
    out.hidden = at::empty({0, model->config().hidden_size}, model->HeadWeight().options());
    out.targets = out.row = out.column = at::empty({0}, longs);
    return out;
  }
  const at::Device device = ids.device();
  const auto on_device = [&](const std::vector<int64_t>& values) {
    at::Tensor host = at::tensor(values, at::kLong);
    return device.is_cuda() ? host.pin_memory().to(device, /*non_blocking=*/true) : host;
  };
  const at::Tensor packed_ids = ids.reshape({-1}).index_select(0, on_device(gather));  // (N)
  model::ForwardBatch batch{packed_ids.unsqueeze(0)};
  batch.cu_seqlens = on_device(starts);
  for (size_t i = 1; i < starts.size(); ++i) {
    batch.max_seqlen = std::max(batch.max_seqlen, starts[i] - starts[i - 1]);
  }
  const at::Tensor index = on_device(predicting);
  out.row = on_device(rows);
  out.column = on_device(columns);
  const at::Tensor hidden = model->Hidden(batch).squeeze(0);  // (N, C)
  out.hidden = hidden.index_select(0, index);
  out.targets = packed_ids.index_select(0, index + 1);
  return out;
}

}  // namespace rlhfd::train
