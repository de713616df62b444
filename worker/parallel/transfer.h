// Moving the rows of a batch from one pool's ranks to another's (rollout → reference, critic,
// reward), straight between workers with grouped send/recv: the driver plans which rows live
// where; no tensor passes through the controller.
#pragma once

#include <ATen/Tensor.h>

#include <vector>

#include "absl/status/statusor.h"
#include "worker/parallel/communicator.h"

namespace rlhfd::parallel {

// Row i of an N-row batch lives on world rank source[i] and is needed on world rank
// destination[i]. Each rank holds its rows in increasing row order, as a (rows on that rank, ...)
// tensor. A rank may be a source and a destination (colocated pools).
struct TransferPlan {
  std::vector<int> source;
  std::vector<int> destination;

  // Rows split evenly and contiguously over each pool's ranks (data-parallel order), as a DP
  // split of the batch gives them.
  static TransferPlan Contiguous(int64_t rows, const std::vector<int>& source_ranks,
                                 const std::vector<int>& destination_ranks);
  // The batch rows `rank` holds as a source (or gets as a destination), increasing.
  std::vector<int64_t> SourceRows(int rank) const;
  std::vector<int64_t> DestinationRows(int rank) const;
};

// Runs `plan` on `world` (ranks are world ranks). `local` holds this rank's source rows (undefined
// if it holds none); returns its destination rows (undefined if it needs none), shaped
// (rows, local's trailing shape) — `row_shape` and `dtype` give that shape when this rank holds
// no source rows. Every rank of `world` calls it.
absl::StatusOr<at::Tensor> ExecuteTransfer(Communicator& world, const TransferPlan& plan,
                                           const at::Tensor& local, at::IntArrayRef row_shape,
                                           at::TensorOptions options);

}  // namespace rlhfd::parallel
