#include "worker/roles/pool_weight_sync.h"

#include <ATen/ATen.h>

#include <chrono>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/util/crc32c.h"
#include "common/util/stopwatch.h"
#include "worker/parallel/tensor_parallel.h"
#include "worker/roles/weight_sync.h"
#include "worker/train/distributed/fully_sharded.h"

namespace rlhfd::roles {
namespace {

// Every rank's entries of `values` at its places, the others -1: the maximum over the ranks
// assembles them (every entry is >= 0 where some rank knows it).
absl::StatusOr<std::vector<int64_t>> Assemble(parallel::Communicator& group,
                                              const at::Device& device,
                                              const std::vector<int64_t>& values) {
  at::Tensor tensor = at::tensor(values, at::kLong).to(device);
  RETURN_IF_ERROR(group.AllReduce(tensor, parallel::ReduceOp::kMax));
  tensor = tensor.cpu().contiguous();
  return std::vector<int64_t>(tensor.data_ptr<int64_t>(),
                              tensor.data_ptr<int64_t>() + values.size());
}

// The parts of each parameter each actor rank holds under ZeRO-3; none (empty) where every
// replica holds the weights whole.
train::FullyShardedModel::PartsByParameter ShardedParts(train::TrainedModel& trained) {
  auto* sharded = dynamic_cast<train::FullyShardedModel*>(&trained);
  return sharded != nullptr ? sharded->PartsOfParameters()
                            : train::FullyShardedModel::PartsByParameter{};
}

}  // namespace

PoolWeightSync::PoolWeightSync(parallel::Communicator& group, int actors, int rollout_tp,
                               const at::Device& device, int64_t bucket_bytes)
    : group_(group),
      actors_(actors),
      rollout_tp_(std::max(1, rollout_tp)),
      device_(device),
      bucket_bytes_(bucket_bytes) {}

absl::Status PoolWeightSync::Agree(const model::ModelConfig& config, train::TrainedModel* trained,
                                   const RolloutDtypes* dtypes) {
  std::vector<parallel::ShardedParameter> specs = parallel::TensorParallelSpecs(config);
  const int size = group_.size(), me = group_.rank();
  const int64_t count = static_cast<int64_t>(specs.size());
  // Entries: a failure flag per rank, the rollout's dtype per parameter, then each actor rank's
  // range of each parameter (parameter-major).
  const int64_t dtypes_at = size, ranges_at = size + count;
  std::vector<int64_t> known(static_cast<size_t>(ranges_at + count * actors_ * 2), -1);
  absl::Status local;
  try {
    if (trained != nullptr) {
      const train::FullyShardedModel::PartsByParameter parts = ShardedParts(*trained);
      auto named = trained->module()->named_parameters();
      for (int64_t p = 0; p < count && local.ok(); ++p) {
        const parallel::ShardedParameter& spec = specs[p];
        const int64_t numel =
            std::accumulate(spec.shape.begin(), spec.shape.end(), int64_t{1}, std::multiplies<>());
        std::pair<int64_t, int64_t> range;
        if (const auto sharded = parts.ranges.find(spec.name); sharded != parts.ranges.end()) {
          range = sharded->second[me];
        } else if (!parts.ranges.empty() || named.find(spec.name) == nullptr ||
                   named[spec.name].numel() != numel) {
          local = absl::InternalError(
              absl::StrCat("the actor's weights have no ", spec.name, " of ", numel, " elements"));
        } else {
          range = {numel * me / actors_, numel * (me + 1) / actors_};
        }
        known[ranges_at + (p * actors_ + me) * 2] = range.first;
        known[ranges_at + (p * actors_ + me) * 2 + 1] = range.second;
      }
    }
    if (dtypes != nullptr) {
      for (int64_t p = 0; p < count && local.ok(); ++p) {
        const auto dtype = dtypes->find(specs[p].name);
        if (dtype == dtypes->end()) {
          local =
              absl::InternalError(absl::StrCat("the rollout's weights have no ", specs[p].name));
        } else {
          known[dtypes_at + p] = static_cast<int64_t>(dtype->second);
        }
      }
    }
  } catch (const std::exception& error) {
    local = absl::InternalError(absl::StrCat("laying out the weights' transfer: ",
                                             std::string(error.what()).substr(0, 300)));
  }
  known[me] = local.ok() ? 0 : 1;
  ASSIGN_OR_RETURN(const std::vector<int64_t> agreed, Assemble(group_, device_, known));
  RETURN_IF_ERROR(local);
  for (int rank = 0; rank < size; ++rank) {
    if (agreed[rank] != 0) {
      return absl::InternalError(absl::StrCat(
          rank < actors_ ? absl::StrCat("actor rank ", rank)
                         : absl::StrCat("rollout rank ", rank - actors_),
          " could not lay out the weights' transfer to the rollout pool (its log says why)"));
    }
  }
  dtypes_.clear();
  for (int64_t p = 0; p < count; ++p) {
    if (agreed[dtypes_at + p] < 0) {
      return absl::InternalError(absl::StrCat("no rollout rank gave the dtype of ", specs[p].name));
    }
    dtypes_.push_back(static_cast<at::ScalarType>(agreed[dtypes_at + p]));
    for (int a = 0; a < actors_; ++a) {
      const int64_t at = ranges_at + (p * actors_ + a) * 2;
      specs[p].train_ranges.emplace_back(agreed[at], agreed[at + 1]);
    }
  }
  specs_ = std::move(specs);
  std::vector<int> train_ranks(static_cast<size_t>(actors_)), rollout_ranks(size - actors_);
  std::iota(train_ranks.begin(), train_ranks.end(), 0);
  std::iota(rollout_ranks.begin(), rollout_ranks.end(), actors_);
  ASSIGN_OR_RETURN(parallel::ReshardPlan plan,
                   parallel::ReshardPlan::Create(
                       group_, specs_, dtypes_, {.dp = actors_, .tp = 1},
                       {.tp = rollout_tp_, .dp = (size - actors_) / rollout_tp_}, device_,
                       {.bucket_bytes = bucket_bytes_,
                        .train_ranks = std::move(train_ranks),
                        .rollout_ranks = std::move(rollout_ranks)}));
  plan_.emplace(std::move(plan));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<at::Tensor>> PoolWeightSync::OwnParts(train::TrainedModel& trained) {
  const int me = group_.rank();
  const train::FullyShardedModel::PartsByParameter parts = ShardedParts(trained);
  auto named = trained.module()->named_parameters();
  std::vector<at::Tensor> own;
  at::NoGradGuard no_grad;
  for (size_t p = 0; p < specs_.size(); ++p) {
    const parallel::ShardedParameter& spec = specs_[p];
    const auto [begin, end] = spec.train_ranges[me];
    at::Tensor part;
    if (parts.ranges.empty()) {
      part = named[spec.name].detach().reshape(-1).narrow(0, begin, end - begin);
    } else if (const auto found = parts.mine.find(spec.name); found != parts.mine.end()) {
      part = found->second;
    } else {
      part = at::empty({0}, at::TensorOptions().device(device_));
    }
    own.push_back(part.to(device_, dtypes_[p]).contiguous());
  }
  return own;
}

absl::StatusOr<std::map<std::string, double>> PoolWeightSync::Send(train::TrainedModel& trained,
                                                                   int64_t step, bool check) {
  const auto start = std::chrono::steady_clock::now();
  if (!plan_) RETURN_IF_ERROR(Agree(trained.module()->config(), &trained, nullptr));
  ASSIGN_OR_RETURN(const std::vector<at::Tensor> own, OwnParts(trained));
  RETURN_IF_ERROR(plan_->Run(group_, own).status());
  check_seconds_.reset();
  if (check) {
    const auto checked = std::chrono::steady_clock::now();
    std::vector<int64_t> crcs(specs_.size() * actors_, -1);
    for (size_t p = 0; p < specs_.size(); ++p) {
      crcs[p * actors_ + group_.rank()] = TensorCrc32c(own[p]);
    }
    ASSIGN_OR_RETURN(checksum_, Check(crcs, step));
    check_seconds_ = SecondsSince(checked);
  }
  return Figures(SecondsSince(start));
}

absl::StatusOr<std::map<std::string, double>> PoolWeightSync::Receive(
    const model::ModelConfig& config, const RolloutDtypes& dtypes, int64_t step, bool check,
    const RolloutWeightsHook& hook, model::Transformer* whole, parallel::Communicator* tp_group,
    std::map<std::string, at::Tensor>* slices) {
  const auto start = std::chrono::steady_clock::now();
  if (!plan_) RETURN_IF_ERROR(Agree(config, nullptr, &dtypes));
  ASSIGN_OR_RETURN(const std::vector<at::Tensor> received, plan_->Run(group_, {}));
  // What the rollout generates with, by name: the whole parameters, or this rank's slices.
  std::map<std::string, at::Tensor> weights;
  at::NoGradGuard no_grad;
  if (whole != nullptr) {
    auto named = (*whole)->named_parameters();
    for (size_t p = 0; p < specs_.size(); ++p) {
      at::Tensor& parameter = named[specs_[p].name];
      parameter.copy_(received[p]);
      weights[specs_[p].name] = parameter;
    }
  } else {
    for (size_t p = 0; p < specs_.size(); ++p) weights[specs_[p].name] = received[p];
    *slices = weights;
  }
  if (hook) hook(/*resharded=*/true, weights, group_.rank() - actors_);
  check_seconds_.reset();
  if (check) {
    const auto checked = std::chrono::steady_clock::now();
    std::vector<int64_t> crcs;
    for (const parallel::ShardedParameter& spec : specs_) {
      at::Tensor full = weights.at(spec.name);
      if (whole == nullptr && spec.tp_dim >= 0 && rollout_tp_ > 1) {
        // The group's slices of this parameter, in slice order, joined along their dim.
        const at::Tensor slice = full.contiguous();
        at::Tensor gathered = at::empty({rollout_tp_ * slice.numel()}, slice.options());
        RETURN_IF_ERROR(tp_group->AllGather(slice.reshape(-1), gathered));
        std::vector<at::Tensor> pieces;
        for (const at::Tensor& piece : gathered.chunk(rollout_tp_)) {
          pieces.push_back(piece.view(slice.sizes()));
        }
        full = at::cat(pieces, spec.tp_dim);
      }
      const at::Tensor flat = full.reshape(-1);
      for (const auto& [begin, end] : spec.train_ranges) {
        crcs.push_back(TensorCrc32c(flat.narrow(0, begin, end - begin)));
      }
    }
    ASSIGN_OR_RETURN(checksum_, Check(crcs, step));
    check_seconds_ = SecondsSince(checked);
  }
  return Figures(SecondsSince(start));
}

absl::StatusOr<double> PoolWeightSync::Check(const std::vector<int64_t>& crcs, int64_t step) {
  const int size = group_.size(), me = group_.rank();
  // What the actor ranks sent: each fills its own parts.
  std::vector<int64_t> sent(crcs.size(), -1);
  if (me < actors_) {
    for (size_t k = me; k < crcs.size(); k += actors_) sent[k] = crcs[k];
  }
  ASSIGN_OR_RETURN(const std::vector<int64_t> expected, Assemble(group_, device_, sent));
  // Each rollout rank's first differing part: [part, received crc] (-1: none).
  std::vector<int64_t> findings(static_cast<size_t>(size) * 2, -1);
  if (me >= actors_) {
    for (size_t k = 0; k < crcs.size(); ++k) {
      if (crcs[k] != expected[k]) {
        findings[me * 2] = static_cast<int64_t>(k);
        findings[me * 2 + 1] = crcs[k];
        break;
      }
    }
  }
  ASSIGN_OR_RETURN(const std::vector<int64_t> found, Assemble(group_, device_, findings));
  for (int rank = actors_; rank < size; ++rank) {
    const int64_t part = found[rank * 2];
    if (part < 0) continue;
    const parallel::ShardedParameter& spec = specs_[part / actors_];
    const int actor = static_cast<int>(part % actors_);
    const auto [begin, end] = spec.train_ranges[actor];
    return absl::DataLossError(absl::StrCat(
        "trainer.verify_weight_sync: step ", step, ": rollout rank ", rank - actors_, "'s copy of ",
        spec.name, " differs from what actor rank ", actor, " sent (elements [", begin, ", ", end,
        "): sent crc32c ", Crc32cHex(static_cast<uint32_t>(expected[part])), ", received ",
        Crc32cHex(static_cast<uint32_t>(found[rank * 2 + 1])), ")"));
  }
  return FoldCrcs(std::vector<uint32_t>(expected.begin(), expected.end()));
}

absl::StatusOr<double> PoolWeightSync::TrainedChecksum(train::TrainedModel& trained,
                                                       parallel::Communicator& pool) {
  if (!plan_) {
    return absl::FailedPreconditionError(
        "the trained weights' checksum for the rollout pool needs a transfer first");
  }
  ASSIGN_OR_RETURN(const std::vector<at::Tensor> own, OwnParts(trained));
  std::vector<int64_t> crcs(specs_.size() * actors_, -1);
  for (size_t p = 0; p < specs_.size(); ++p) {
    crcs[p * actors_ + pool.rank()] = TensorCrc32c(own[p]);
  }
  ASSIGN_OR_RETURN(const std::vector<int64_t> all, Assemble(pool, device_, crcs));
  return FoldCrcs(std::vector<uint32_t>(all.begin(), all.end()));
}

std::map<std::string, double> PoolWeightSync::Figures(double seconds) const {
  const parallel::ReshardStats& stats = plan_->stats();
  std::map<std::string, double> figures = {
      {"sync_weights_s", seconds},
      {"reshard_received_bytes", static_cast<double>(stats.received_bytes)},
      {"reshard_buffer_bytes", static_cast<double>(stats.buffer_bytes)}};
  if (check_seconds_) {
    figures["weight_sync_ok"] = 1;
    figures["weight_sync_check_s"] = *check_seconds_;
    figures["rollout_weights_checksum"] = *checksum_;
  }
  return figures;
}

}  // namespace rlhfd::roles
