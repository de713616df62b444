// The actor's weights to a rollout pool of its own (roles.rollout, verl's standalone rollout).
//
// Over a communicator of the actor ranks (first, in their pool's order) and the rollout ranks
// (after them), every actor rank sends its part of each parameter straight to every rollout rank
// (ReshardPlan across pools: no rank gathers the model, the transient memory is one bucket) and
// every rollout rank receives its whole copy (rollout tp 1) or its tensor-parallel slices (tp > 1:
// no rank of either pool holds the whole model). An actor rank's part is its ZeRO-3
// shard of the parameter, or, where every replica holds the weights whole, an even 1/actors share
// of it, so every sender carries an equal part. Each part is cast to the dtype the rollout holds
// the parameter in (the rollout ranks say which, as they loaded it).
//
// trainer.verify_weight_sync: the CRC-32C of every part is computed on the actor rank that sent it
// and, over the same elements of its copy, on every rollout rank (at tp > 1 over the weights its
// tensor-parallel group gathers for the check, as the hybrid engine's checked steps do); a copy
// that differs fails the step on every rank of both pools with DATA_LOSS naming the tensor, the
// rollout rank, the actor rank and both CRCs. The parts' CRCs folded in order (parameter by
// parameter, actor rank by actor rank) are the weights' checksum, which the actor's update reports
// for the weights it leaves (TrainedChecksum) and the rollout reports for the weights it received.
#pragma once

#include <ATen/Device.h>
#include <ATen/Tensor.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/transformer.h"
#include "worker/parallel/communicator.h"
#include "worker/parallel/reshard.h"
#include "worker/roles/hybrid_engine.h"
#include "worker/roles/weight_sync.h"
#include "worker/train/trained_model.h"

namespace rlhfd::roles {

class PoolWeightSync {
 public:
  // `group`: the actor ranks at [0, actors), the rollout ranks after; it outlives this object.
  // `rollout_tp`: the rollout pool's tensor-parallel size; `bucket_bytes`: at most this much of
  // send and receive buffers per rank.
  PoolWeightSync(parallel::Communicator& group, int actors, int rollout_tp,
                 const at::Device& device, int64_t bucket_bytes);

  // Every rank of the group calls one of these together. An actor rank sends its part of
  // `trained`'s weights. A rollout rank receives them in `dtypes` (by name, the parameters of
  // `config`'s model): at tp 1 whole, into `whole`'s parameters; at tp > 1 its slices of its
  // `tp_group`, into `slices` (`hook`, for tests, sees them before the check). `check`: the
  // step's weight-sync check is due. Returns its figures: sync_weights_s, reshard_received_bytes
  // and reshard_buffer_bytes, and on a checked step weight_sync_ok, weight_sync_check_s and
  // rollout_weights_checksum.
  absl::StatusOr<std::map<std::string, double>> Send(train::TrainedModel& trained, int64_t step,
                                                     bool check);
  absl::StatusOr<std::map<std::string, double>> Receive(const model::ModelConfig& config,
                                                        const RolloutDtypes& dtypes, int64_t step,
                                                        bool check, const RolloutWeightsHook& hook,
                                                        model::Transformer* whole,
                                                        parallel::Communicator* tp_group,
                                                        std::map<std::string, at::Tensor>* slices);

  // Actor ranks, together over their own `pool`: the checksum a rollout will report once it has
  // `trained`'s current weights (after the first Send, which learns the rollout's dtypes).
  absl::StatusOr<double> TrainedChecksum(train::TrainedModel& trained,
                                         parallel::Communicator& pool);

 private:
  // The parameters' layout agreed by both pools: names and shapes, each actor rank's range, the
  // rollout's dtypes. Each rank fills what it knows; a failure on any rank fails every rank.
  absl::Status Agree(const model::ModelConfig& config, train::TrainedModel* trained,
                     const RolloutDtypes* dtypes);
  // This actor rank's part of every parameter, flat, in the rollout's dtype.
  absl::StatusOr<std::vector<at::Tensor>> OwnParts(train::TrainedModel& trained);
  // The check after a transfer: `crcs` are this rank's CRCs of the parts it knows (an actor rank
  // its own, a rollout rank every part of its copy), by (parameter, actor rank).
  absl::StatusOr<double> Check(const std::vector<int64_t>& crcs, int64_t step);
  std::map<std::string, double> Figures(double seconds) const;

  parallel::Communicator& group_;
  int actors_;
  int rollout_tp_;
  at::Device device_;
  int64_t bucket_bytes_;
  std::vector<parallel::ShardedParameter> specs_;  // train_ranges: each actor rank's part
  std::vector<at::ScalarType> dtypes_;             // the rollout's
  std::optional<parallel::ReshardPlan> plan_;
  std::optional<double> check_seconds_, checksum_;
};

}  // namespace rlhfd::roles
