#include "worker/parallel/transfer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/util/row_split.h"

namespace rlhfd::parallel {

TransferPlan TransferPlan::Contiguous(int64_t rows, const std::vector<int>& source_ranks,
                                      const std::vector<int>& destination_ranks) {
  TransferPlan plan;
  const auto owner = [rows](const std::vector<int>& ranks, int64_t row) {
    return ranks[static_cast<size_t>(PartOfRow(rows, row, static_cast<int64_t>(ranks.size())))];
  };
  for (int64_t row = 0; row < rows; ++row) {
    plan.source.push_back(owner(source_ranks, row));
    plan.destination.push_back(owner(destination_ranks, row));
  }
  return plan;
}

std::vector<int64_t> TransferPlan::SourceRows(int rank) const {
  std::vector<int64_t> rows;
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == rank) rows.push_back(static_cast<int64_t>(i));
  }
  return rows;
}

std::vector<int64_t> TransferPlan::DestinationRows(int rank) const {
  std::vector<int64_t> rows;
  for (size_t i = 0; i < destination.size(); ++i) {
    if (destination[i] == rank) rows.push_back(static_cast<int64_t>(i));
  }
  return rows;
}

absl::StatusOr<at::Tensor> ExecuteTransfer(Communicator& world, const TransferPlan& plan,
                                           const at::Tensor& local, at::IntArrayRef row_shape,
                                           at::TensorOptions options) {
  if (plan.source.size() != plan.destination.size()) {
    return absl::InvalidArgumentError("transfer plan: source and destination lengths differ");
  }
  const int me = world.rank();
  const std::vector<int64_t> mine = plan.SourceRows(me), wanted = plan.DestinationRows(me);
  if (!mine.empty() && (!local.defined() || local.size(0) != static_cast<int64_t>(mine.size()))) {
    return absl::InvalidArgumentError(absl::StrCat("transfer: rank ", me, " holds ", mine.size(),
                                                   " rows by the plan but was given ",
                                                   local.defined() ? local.size(0) : 0));
  }
  std::vector<int64_t> shape = {static_cast<int64_t>(wanted.size())};
  shape.insert(shape.end(), row_shape.begin(), row_shape.end());
  at::Tensor out = wanted.empty() ? at::Tensor() : at::empty(shape, options);
  // Position of each batch row in this rank's local source rows and destination rows.
  std::map<int64_t, int64_t> source_position, destination_position;
  for (size_t k = 0; k < mine.size(); ++k) source_position[mine[k]] = static_cast<int64_t>(k);
  for (size_t k = 0; k < wanted.size(); ++k)
    destination_position[wanted[k]] = static_cast<int64_t>(k);
  // Per peer, the rows going each way, in increasing row order on both sides.
  std::map<int, std::vector<int64_t>> send_rows, receive_rows;
  for (size_t i = 0; i < plan.source.size(); ++i) {
    const int from = plan.source[i], to = plan.destination[i];
    if (from == me && to == me) {
      out[destination_position[i]].copy_(local[source_position[i]]);
    } else if (from == me) {
      send_rows[to].push_back(source_position[i]);
    } else if (to == me) {
      receive_rows[from].push_back(destination_position[i]);
    }
  }
  const auto index = [&](const std::vector<int64_t>& rows) {
    return at::tensor(rows, at::kLong).to(options.device());
  };
  std::vector<PeerTransfer> transfers;
  std::vector<std::pair<at::Tensor, at::Tensor>> landing;  // (buffer, destination positions)
  for (const auto& [peer, rows] : send_rows) {
    transfers.push_back(
        {PeerTransfer::Direction::kSend, peer, local.index_select(0, index(rows)).contiguous()});
  }
  for (const auto& [peer, rows] : receive_rows) {
    std::vector<int64_t> buffer_shape = shape;
    buffer_shape[0] = static_cast<int64_t>(rows.size());
    at::Tensor buffer = at::empty(buffer_shape, options);
    transfers.push_back({PeerTransfer::Direction::kRecv, peer, buffer});
    landing.emplace_back(buffer, index(rows));
  }
  RETURN_IF_ERROR(world.SendRecv(transfers));
  for (const auto& [buffer, positions] : landing) out.index_copy_(0, positions, buffer);
  return out;
}

}  // namespace rlhfd::parallel
