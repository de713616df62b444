#include "worker/roles/weight_sync.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <tuple>
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

// Every rank's trained pieces (TrainedModel::Pieces) and their CRC-32C in the layout's order
// rank by rank, each piece cast to the dtype the rollout holds it in (as the update casts it).
struct SharedPieces {
  std::vector<std::vector<train::TrainedModel::PieceSpan>> layout;
  std::vector<uint32_t> crcs;
};

// Every rank of `pool` calls it together; a rank's failure (a library error) is shared, so that
// every rank returns an error rather than one waiting for the others in a later collective.
absl::StatusOr<SharedPieces> ShareTrainedPieces(train::TrainedModel& trained,
                                                const RolloutDtypes& dtypes,
                                                parallel::Communicator& pool,
                                                const at::Device& device) {
  SharedPieces shared;
  absl::Status local;
  std::vector<double> mine;
  try {
    train::TrainedModel::OwnedPieces pieces = trained.Pieces();
    shared.layout = std::move(pieces.layout);
    if (shared.layout.size() != static_cast<size_t>(pool.size())) {
      local = absl::InternalError(absl::StrCat("the trained weights are laid out over ",
                                               shared.layout.size(), " ranks, the actor pool has ",
                                               pool.size()));
    } else {
      const std::vector<train::TrainedModel::PieceSpan>& spans = shared.layout[pool.rank()];
      for (size_t i = 0; i < spans.size(); ++i) {
        const auto dtype = dtypes.find(spans[i].name);
        const at::Tensor& values = pieces.values[i];
        mine.push_back(TensorCrc32c(dtype == dtypes.end() ? values : values.to(dtype->second)));
      }
    }
  } catch (const std::exception& error) {
    local = absl::InternalError(
        absl::StrCat("the trained weights' checksums: ", std::string(error.what()).substr(0, 300)));
  }
  // Entries: every rank's CRCs at its place, then a failure flag per rank.
  size_t total = 0, first = 0;
  if (local.ok()) {
    for (int rank = 0; rank < pool.size(); ++rank) {
      if (rank == pool.rank()) first = total;
      total += shared.layout[rank].size();
    }
  }
  // The failures first: a rank that failed cannot size the exchange of the CRCs.
  std::vector<double> flags(static_cast<size_t>(pool.size()), 0.0);
  flags[pool.rank()] = local.ok() ? 0.0 : 1.0;
  RETURN_IF_ERROR(train::ReduceDoubles(pool, device, flags, train::ReplicaReduce::kMax));
  RETURN_IF_ERROR(local);
  for (int rank = 0; rank < pool.size(); ++rank) {
    if (flags[rank] != 0) {
      return absl::InternalError(absl::StrCat("actor rank ", rank,
                                              " could not checksum its trained weights (its log "
                                              "says why)"));
    }
  }
  std::vector<double> all(total, 0.0);
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(first));
  RETURN_IF_ERROR(train::ReduceDoubles(pool, device, all, train::ReplicaReduce::kMax));
  shared.crcs.assign(all.begin(), all.end());
  return shared;
}

}  // namespace

bool WeightSyncCheckDue(const v1::JobSpec& spec, int64_t step) {
  const int64_t every = spec.trainer().verify_weight_sync();
  return every > 0 && step >= 1 && (step - 1) % every == 0;
}

int64_t FirstRolloutAfterUpdate(const v1::JobSpec& spec, int64_t step) {
  return step + (spec.trainer().mode() == v1::TRAINER_MODE_ONE_STEP_OFF ? 2 : 1);
}

uint32_t TensorCrc32c(const at::Tensor& tensor) { return ExtendWithTensor(0, tensor); }

double FoldCrcs(const std::vector<uint32_t>& crcs) {
  uint32_t folded = 0;
  for (uint32_t crc : crcs) folded = ExtendWithCrc(folded, crc);
  return folded;
}

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
  ASSIGN_OR_RETURN(const SharedPieces shared,
                   ShareTrainedPieces(trained, DtypesOf(rollout), pool, device));
  // This rank's rollout weights against every rank's trained pieces: each rank checks the
  // weights it will generate from, whole. A span every replica holds alike (ZeRO-2) is summed
  // once.
  const auto named = rollout->named_parameters();
  std::map<std::string, int64_t> index_of;
  for (size_t i = 0; i < named.size(); ++i) index_of[named[i].key()] = static_cast<int64_t>(i);
  // This rank's first finding: [parameter index + 1 (-1: this rank could not check), trainer
  // rank, first element, elements, trained CRC, rollout CRC].
  constexpr int kFields = 6;
  std::vector<double> mine(kFields, 0.0);
  absl::Status local;
  try {
    std::map<std::tuple<std::string, int64_t, int64_t>, uint32_t> summed;
    size_t k = 0;
    for (int rank = 0; rank < pool.size() && mine[0] == 0; ++rank) {
      for (const train::TrainedModel::PieceSpan& span : shared.layout[rank]) {
        const uint32_t want = shared.crcs[k++];
        const auto parameter = index_of.find(span.name);
        if (parameter == index_of.end() ||
            named[parameter->second].value().numel() < span.offset + span.count) {
          local = absl::InternalError(absl::StrCat("the rollout's weights have no ", span.name,
                                                   " of ", span.offset + span.count, " elements"));
          mine[0] = -1;
          break;
        }
        const auto key = std::make_tuple(span.name, span.offset, span.count);
        auto have = summed.find(key);
        if (have == summed.end()) {
          const at::Tensor values = named[parameter->second].value().detach().reshape(-1);
          have = summed.emplace(key, TensorCrc32c(values.narrow(0, span.offset, span.count))).first;
        }
        if (have->second != want) {
          mine = {static_cast<double>(parameter->second + 1),
                  static_cast<double>(rank),
                  static_cast<double>(span.offset),
                  static_cast<double>(span.count),
                  static_cast<double>(want),
                  static_cast<double>(have->second)};
          break;
        }
      }
    }
  } catch (const std::exception& error) {
    local = absl::InternalError(
        absl::StrCat("checking the rollout's weights: ", std::string(error.what()).substr(0, 300)));
    mine[0] = -1;
  }
  // Every rank learns every rank's finding, so that all fail together with the same message.
  std::vector<double> found(kFields * static_cast<size_t>(pool.size()), 0.0);
  std::copy(mine.begin(), mine.end(), found.begin() + kFields * pool.rank());
  // Each rank's slots carry its own finding; the others put -2 (below any finding) in the
  // first field and 0 in the rest, so the maximum keeps it.
  for (int rank = 0; rank < pool.size(); ++rank) {
    if (rank != pool.rank()) found[kFields * rank] = -2;
  }
  RETURN_IF_ERROR(train::ReduceDoubles(pool, device, found, train::ReplicaReduce::kMax));
  RETURN_IF_ERROR(local);
  std::vector<std::string> mismatches;
  for (int rank = 0; rank < pool.size(); ++rank) {
    const double* finding = found.data() + kFields * rank;
    if (finding[0] == -1) {
      return absl::InternalError(absl::StrCat("trainer.verify_weight_sync: step ", step,
                                              ": actor rank ", rank,
                                              " could not check its rollout weights (its log "
                                              "says why)"));
    }
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
  return WeightSyncCheck{.seconds = SecondsSince(start), .checksum = FoldCrcs(shared.crcs)};
}

absl::StatusOr<double> TrainedWeightsChecksum(train::TrainedModel& trained,
                                              const RolloutDtypes& dtypes,
                                              parallel::Communicator& pool,
                                              const at::Device& device) {
  at::NoGradGuard no_grad;
  ASSIGN_OR_RETURN(const SharedPieces shared, ShareTrainedPieces(trained, dtypes, pool, device));
  return FoldCrcs(shared.crcs);
}

}  // namespace rlhfd::roles
