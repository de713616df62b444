#include "worker/train/batching.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

#include "absl/container/flat_hash_map.h"

namespace rlhfd::train {

std::vector<std::vector<int64_t>> SplitMicroBatches(const std::vector<int64_t>& rows,
                                                    const std::vector<int64_t>& tokens,
                                                    int64_t rows_per_micro_batch,
                                                    int64_t token_budget, int64_t group) {
  std::vector<std::vector<int64_t>> batches;
  if (token_budget <= 0) {
    const size_t step = static_cast<size_t>(std::max<int64_t>(rows_per_micro_batch, 1));
    for (size_t i = 0; i < rows.size(); i += step) {
      batches.emplace_back(rows.begin() + i, rows.begin() + std::min(rows.size(), i + step));
    }
    return batches;
  }
  // Units of positions in `rows` filled together, with their token counts.
  std::vector<std::vector<size_t>> units;
  std::vector<int64_t> counts;
  const size_t run = group > 1 && rows.size() % group == 0 ? static_cast<size_t>(group) : 1;
  for (size_t first = 0; first < rows.size(); first += run) {
    int64_t count = 0;
    for (size_t i = first; i < first + run; ++i) count += tokens[rows[i]];
    if (run > 1 && count > token_budget) {  // The run does not fit: its rows one by one.
      for (size_t i = first; i < first + run; ++i) {
        units.push_back({i});
        counts.push_back(tokens[rows[i]]);
      }
      continue;
    }
    units.emplace_back();
    for (size_t i = first; i < first + run; ++i) units.back().push_back(i);
    counts.push_back(count);
  }
  std::vector<size_t> order(units.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return counts[a] > counts[b]; });
  std::vector<int64_t> load;
  std::vector<std::vector<size_t>> members;  // Positions in `rows`, to keep the input order.
  for (size_t u : order) {
    size_t bin = 0;
    while (bin < load.size() && load[bin] + counts[u] > token_budget) ++bin;
    if (bin == load.size()) {
      load.push_back(0);
      members.emplace_back();
    }
    load[bin] += counts[u];
    members[bin].insert(members[bin].end(), units[u].begin(), units[u].end());
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

PackedRows PlanPackedRows(const int64_t* ids, const bool* real, const bool* scored, int64_t n,
                          int64_t t, bool share) {
  // Rows sharing a prefix are found among earlier rows that begin with the same
  // kMinSharedPrefix tokens; of those (the latest kCandidates), the one sharing the most.
  constexpr size_t kCandidates = 64;
  PackedRows plan;
  plan.starts = {0};
  plan.key_starts = {0};
  std::vector<std::vector<int64_t>> keys(n);     // the packed token of each position of a row
  std::vector<std::vector<int64_t>> row_ids(n);  // a row's real tokens (where sharing)
  absl::flat_hash_map<std::vector<int64_t>, std::vector<int64_t>> by_opening;
  bool any_shared = false;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int64_t> columns;
    for (int64_t c = 0; c < t; ++c) {
      if (real[i * t + c]) columns.push_back(c);
    }
    const int64_t length = static_cast<int64_t>(columns.size());
    int64_t shared = 0, from = -1;
    if (share && length > kMinSharedPrefix) {
      std::vector<int64_t>& own = row_ids[i];
      for (int64_t c : columns) own.push_back(ids[i * t + c]);
      std::vector<int64_t>& earlier =
          by_opening[std::vector<int64_t>(own.begin(), own.begin() + kMinSharedPrefix)];
      for (size_t k = earlier.size(); k-- > 0 && earlier.size() - k <= kCandidates;) {
        const std::vector<int64_t>& other = row_ids[earlier[k]];
        const auto [mismatch, unused] = std::mismatch(
            own.begin(), own.begin() + std::min(own.size(), other.size()), other.begin());
        if (mismatch - own.begin() > shared) {
          shared = mismatch - own.begin();
          from = earlier[k];
        }
      }
      shared = std::min(shared, length - 1);  // at least one token of its own
      if (shared < kMinSharedPrefix) shared = 0;
      earlier.push_back(i);
    }
    any_shared = any_shared || shared > 0;
    std::vector<int64_t>& row_keys = keys[i];
    if (shared > 0) row_keys.assign(keys[from].begin(), keys[from].begin() + shared);
    for (int64_t p = shared; p < length; ++p) {
      row_keys.push_back(static_cast<int64_t>(plan.tokens.size()));
      plan.tokens.push_back(i * t + columns[p]);
      plan.positions.push_back(p);
    }
    plan.starts.push_back(static_cast<int64_t>(plan.tokens.size()));
    plan.key_starts.push_back(plan.key_starts.back() + length);
    plan.max_length = std::max(plan.max_length, length - shared);
    plan.max_keys = std::max(plan.max_keys, length);
    for (int64_t p = 0; p + 1 < length; ++p) {
      if (scored != nullptr && !scored[i * (t - 1) + columns[p]]) continue;
      plan.scored.push_back(row_keys[p]);
      plan.targets.push_back(i * t + columns[p + 1]);
      plan.rows.push_back(i);
      plan.columns.push_back(columns[p]);
    }
  }
  if (any_shared) {
    for (const std::vector<int64_t>& row_keys : keys) {
      plan.key_index.insert(plan.key_index.end(), row_keys.begin(), row_keys.end());
    }
  }
  return plan;
}

namespace {

// The host vectors as int64 tensors on `device`, by one copy (from pinned memory where a GPU).
std::vector<at::Tensor> OnDevice(const std::vector<const std::vector<int64_t>*>& parts,
                                 const at::Device& device) {
  int64_t total = 0;
  for (const auto* part : parts) total += static_cast<int64_t>(part->size());
  const at::Tensor host =
      at::empty({total}, at::TensorOptions().dtype(at::kLong).pinned_memory(device.is_cuda()));
  int64_t* data = host.data_ptr<int64_t>();
  for (const auto* part : parts) data = std::copy(part->begin(), part->end(), data);
  const at::Tensor moved = device.is_cuda() ? host.to(device, /*non_blocking=*/true) : host;
  std::vector<at::Tensor> tensors;
  int64_t offset = 0;
  for (const auto* part : parts) {
    tensors.push_back(moved.narrow(0, offset, static_cast<int64_t>(part->size())));
    offset += static_cast<int64_t>(part->size());
  }
  return tensors;
}

// `mask` (n, T - 1 or T) as a row-major bool copy on the host.
at::Tensor HostBools(const at::Tensor& mask) { return mask.ne(0).cpu().contiguous(); }

}  // namespace

ScoredPositions ForwardMicroBatch(model::Transformer& model, const at::Tensor& ids,
                                  const at::Tensor& attention_mask, const MicroBatchForward& how) {
  const int64_t n = ids.size(0), t = ids.size(1);
  const auto longs = ids.options().dtype(at::kLong);
  ScoredPositions out;
  out.rows = n;
  out.columns = t - 1;
  if (how.scored.defined()) {
    TORCH_CHECK(how.scored.dim() == 2 && how.scored.size(0) == n && how.scored.size(1) == t - 1,
                "the scored positions are (", n, ", ", t - 1, "), not ", how.scored.sizes());
  }
  if (!how.packed && !model->PacksWithVarlenAttention(ids.device())) {
    // Without padding the mask adds nothing, and leaving it out lets attention run the fused
    // causal kernels instead of a masked one.
    const bool padded = attention_mask.defined() && attention_mask.min().item<int64_t>() == 0;
    const at::Tensor hidden =
        model->Hidden({ids, padded ? attention_mask : at::Tensor()});  // (n, T, C)
    if (!how.scored.defined()) {
      out.hidden = hidden.narrow(1, 0, t - 1).reshape({n * (t - 1), -1});
      out.targets = ids.narrow(1, 1, t - 1).reshape({n * (t - 1)});
      out.row = at::arange(n, longs).repeat_interleave(t - 1);
      out.column = at::arange(t - 1, longs).repeat({n});
      return out;
    }
    // The scored positions picked from the (n T) rows as they are (no copy of all n (T-1)).
    const at::Tensor flat = how.scored.to(ids.device()).ne(0).reshape({-1}).nonzero().squeeze(1);
    out.row = flat.div(t - 1, "floor");
    out.column = flat.remainder(t - 1);
    const at::Tensor position = out.row * t + out.column;
    out.hidden = hidden.reshape({n * t, -1}).index_select(0, position);
    out.targets = ids.reshape({-1}).index_select(0, position + 1);
    return out;
  }
  // Packed: every index is worked out on the host from one copy of the masks (and the ids, to
  // find shared prefixes) and moved to the device at once, before the forward, so that the host
  // never waits for the GPU in between (a blocking copy after the forward would wait for all of
  // it).
  const at::Tensor real =
      attention_mask.defined() ? HostBools(attention_mask) : at::ones({n, t}, at::kBool);
  const at::Tensor scored = how.scored.defined() ? HostBools(how.scored) : at::Tensor();
  const at::Tensor host_ids =
      how.share_prefixes ? ids.to(at::kCPU, at::kLong).contiguous() : at::Tensor();
  const PackedRows plan = PlanPackedRows(
      how.share_prefixes ? host_ids.data_ptr<int64_t>() : nullptr, real.data_ptr<bool>(),
      scored.defined() ? scored.data_ptr<bool>() : nullptr, n, t, how.share_prefixes);
  if (plan.max_keys < 2) {  // No row has two tokens: nothing to score, no model to run.
    out.hidden = at::empty({0, model->config().hidden_size}, model->HeadWeight().options());
    out.targets = out.row = out.column = at::empty({0}, longs);
    return out;
  }
  const std::vector<at::Tensor> on_device =
      OnDevice({&plan.tokens, &plan.positions, &plan.starts, &plan.key_index, &plan.key_starts,
                &plan.scored, &plan.targets, &plan.rows, &plan.columns},
               ids.device());
  const at::Tensor flat_ids = ids.reshape({-1});
  model::ForwardBatch batch{flat_ids.index_select(0, on_device[0]).unsqueeze(0)};  // (1, N)
  batch.position_ids = on_device[1].unsqueeze(0);
  batch.cu_seqlens = on_device[2];
  batch.max_seqlen = plan.max_length;
  if (!plan.key_index.empty()) {
    batch.key_index = on_device[3];
    batch.key_cu_seqlens = on_device[4];
    batch.key_max_seqlen = plan.max_keys;
  }
  const at::Tensor hidden = model->Hidden(batch).squeeze(0);  // (N, C)
  out.hidden = hidden.index_select(0, on_device[5]);
  out.targets = flat_ids.index_select(0, on_device[6]);
  out.row = on_device[7];
  out.column = on_device[8];
  return out;
}

}  // namespace rlhfd::train
