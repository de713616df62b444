#include "worker/roles/weight_sync.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status/status_macros.h"
#include "common/util/crc32c.h"
#include "common/util/stopwatch.h"
#include "worker/train/distributed/replicated_model.h"

namespace rlhfd::roles {
namespace {

// A GPU tensor crosses to the host in pieces of this size, so a check never holds a second copy
// of a large tensor in host memory.
constexpr int64_t kHostPieceBytes = 64 << 20;

uint32_t ExtendWithTensor(uint32_t crc, const at::Tensor& tensor) {
  const at::Tensor flat = tensor.contiguous().reshape(-1);
  if (flat.is_cpu()) {
    return Crc32cExtend(crc, absl::string_view(static_cast<const char*>(flat.const_data_ptr()),
                                               flat.numel() * flat.element_size()));
  }
  const int64_t per_piece = std::max<int64_t>(1, kHostPieceBytes / flat.element_size());
  for (int64_t first = 0; first < flat.numel(); first += per_piece) {
    const at::Tensor host = flat.narrow(0, first, std::min(per_piece, flat.numel() - first)).cpu();
    crc = Crc32cExtend(crc, absl::string_view(static_cast<const char*>(host.const_data_ptr()),
                                              host.numel() * host.element_size()));
  }
  return crc;
}

uint32_t ExtendWithCrc(uint32_t crc, uint32_t value) {
  return Crc32cExtend(crc, absl::string_view(reinterpret_cast<const char*>(&value), sizeof(value)));
}

// Every rank's trained pieces' CRC-32C, in the layout's order rank by rank, each piece cast to
// the dtype the rollout holds it in (as the update casts it).
absl::StatusOr<std::vector<uint32_t>> SharedTrainedCrcs(
    const train::TrainedModel::OwnedPieces& pieces, const RolloutDtypes& dtypes,
    parallel::Communicator& pool, const at::Device& device) {
  if (pieces.layout.size() != static_cast<size_t>(pool.size())) {
    return absl::InternalError(absl::StrCat("the trained weights are laid out over ",
                                            pieces.layout.size(), " ranks, the actor pool has ",
                                            pool.size()));
  }
  size_t total = 0, first = 0;
  for (int rank = 0; rank < pool.size(); ++rank) {
    if (rank == pool.rank()) first = total;
    total += pieces.layout[rank].size();
  }
  std::vector<double> shared(total, 0.0);
  const std::vector<train::TrainedModel::PieceSpan>& mine = pieces.layout[pool.rank()];
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto dtype = dtypes.find(mine[i].name);
    const at::Tensor& values = pieces.values[i];
    shared[first + i] = TensorCrc32c(dtype == dtypes.end() ? values : values.to(dtype->second));
  }
  RETURN_IF_ERROR(train::ReduceDoubles(pool, device, shared, train::ReplicaReduce::kMax));
  return std::vector<uint32_t>(shared.begin(), shared.end());
}

double Fold(const std::vector<uint32_t>& crcs) {
  uint32_t folded = 0;
  for (uint32_t crc : crcs) folded = ExtendWithCrc(folded, crc);
  return folded;
}

}  // namespace

bool WeightSyncCheckDue(const v1::JobSpec& spec, int64_t step) {
  const int64_t every = spec.trainer().verify_weight_sync();
  return every > 0 && step >= 1 && (step - 1) % every == 0;
}

uint32_t TensorCrc32c(const at::Tensor& tensor) { return ExtendWithTensor(0, tensor); }

RolloutDtypes DtypesOf(model::Transformer& rollout) {
  RolloutDtypes dtypes;
  for (const auto& item : rollout->named_parameters()) {
    dtypes[item.key()] = item.value().scalar_type();
  }
  return dtypes;
}

absl::StatusOr<WeightSyncCheck> VerifyRolloutWeights(train::TrainedModel& trained,
                                                     model::Transformer& rollout,
                                                     parallel::Communicator& pool,
                                                     const at::Device& device, int64_t step) {
  const auto start = std::chrono::steady_clock::now();
  at::NoGradGuard no_grad;
  const train::TrainedModel::OwnedPieces pieces = trained.Pieces();
  ASSIGN_OR_RETURN(const std::vector<uint32_t> expected,
                   SharedTrainedCrcs(pieces, DtypesOf(rollout), pool, device));
  // This rank's rollout weights against every rank's trained pieces: each rank checks the
  // weights it will generate with, whole.
  const auto named = rollout->named_parameters();
  std::map<std::string, int64_t> index_of;
  for (size_t i = 0; i < named.size(); ++i) index_of[named[i].key()] = static_cast<int64_t>(i);
  // This rank's first differing piece: [parameter index + 1 (0: none), trainer rank, first
  // element, elements, trained CRC, rollout CRC].
  constexpr int kFields = 6;
  std::vector<double> mine(kFields, 0.0);
  absl::Status local;
  size_t k = 0;
  for (int rank = 0; rank < pool.size() && mine[0] == 0; ++rank) {
    for (const train::TrainedModel::PieceSpan& span : pieces.layout[rank]) {
      const uint32_t want = expected[k++];
      const auto found = index_of.find(span.name);
      uint32_t have = 0;
      if (found == index_of.end() ||
          named[found->second].value().numel() < span.offset + span.count) {
        // Said after the findings are shared, so that no rank waits for this one.
        local = absl::InternalError(absl::StrCat("the rollout's weights have no ", span.name,
                                                 " of ", span.offset + span.count, " elements"));
      } else {
        have = TensorCrc32c(
            named[found->second].value().detach().reshape(-1).narrow(0, span.offset, span.count));
      }
      if (!local.ok() || have != want) {
        mine = {static_cast<double>(local.ok() ? found->second + 1 : 1),
                static_cast<double>(rank),
                static_cast<double>(span.offset),
                static_cast<double>(span.count),
                static_cast<double>(want),
                static_cast<double>(have)};
        break;
      }
    }
  }
  // Every rank learns every rank's finding, so that all fail together with the same message.
  std::vector<double> found(kFields * static_cast<size_t>(pool.size()), 0.0);
  std::copy(mine.begin(), mine.end(), found.begin() + kFields * pool.rank());
  RETURN_IF_ERROR(train::ReduceDoubles(pool, device, found, train::ReplicaReduce::kMax));
  RETURN_IF_ERROR(local);
  std::vector<std::string> mismatches;
  for (int rank = 0; rank < pool.size(); ++rank) {
    const double* finding = found.data() + kFields * rank;
    const int64_t parameter = static_cast<int64_t>(finding[0]) - 1;
    if (parameter < 0) continue;
    const auto offset = static_cast<int64_t>(finding[2]);
    mismatches.push_back(
        absl::StrCat(named[parameter].key(), " in actor rank ", rank,
                     "'s rollout weights (trained on rank ", static_cast<int64_t>(finding[1]),
                     "; elements [", offset, ", ", offset + static_cast<int64_t>(finding[3]),
                     "): trained crc32c ", Crc32cHex(static_cast<uint32_t>(finding[4])),
                     ", rollout ", Crc32cHex(static_cast<uint32_t>(finding[5])), ")"));
  }
  if (!mismatches.empty()) {
    return absl::DataLossError(absl::StrCat(
        "trainer.verify_weight_sync: step ", step,
        ": the rollout's weights differ from the trained ones: ", absl::StrJoin(mismatches, "; "),
        ". The train-to-rollout weight update went wrong; the step is not trained"));
  }
  return WeightSyncCheck{.seconds = SecondsSince(start), .checksum = Fold(expected)};
}

absl::StatusOr<double> TrainedWeightsChecksum(train::TrainedModel& trained,
                                              const RolloutDtypes& dtypes,
                                              parallel::Communicator& pool,
                                              const at::Device& device) {
  at::NoGradGuard no_grad;
  ASSIGN_OR_RETURN(const std::vector<uint32_t> crcs,
                   SharedTrainedCrcs(trained.Pieces(), dtypes, pool, device));
  return Fold(crcs);
}

}  // namespace rlhfd::roles
