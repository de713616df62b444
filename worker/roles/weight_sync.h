// Checks that the rollout generates with the weights the actor trained
// (trainer.verify_weight_sync): after the train → rollout update, every actor rank computes a
// CRC-32C of each piece of the trained weights it holds as its source of truth
// (TrainedModel::Pieces: whole parameters, or its ZeRO-3 shards), cast to the dtype the rollout
// holds it in as the update casts it; the pool shares them, and each rank checks the whole of its
// rollout weights against every rank's pieces. So a gather that sent a wrong or partial shard, a
// cast or copy gone wrong, replicas that diverged, or a rollout left on stale weights are caught
// before generating. Every rank learns every rank's first mismatch, so the whole pool fails the
// step together, each naming the tensor and the ranks.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "worker/model/transformer.h"
#include "worker/parallel/communicator.h"
#include "worker/train/trained_model.h"

namespace rlhfd::roles {

// Whether step `step`'s rollout is checked: every trainer.verify_weight_sync steps from step 1.
bool WeightSyncCheckDue(const v1::JobSpec& spec, int64_t step);

// The step whose rollout first uses the weights step `step`'s update leaves (one_step_off: the
// rollout after next).
int64_t FirstRolloutAfterUpdate(const v1::JobSpec& spec, int64_t step);

// CRC-32C of a tensor's bytes in memory order (a GPU tensor is copied to the host in pieces).
uint32_t TensorCrc32c(const at::Tensor& tensor);
// CRCs folded in order into one CRC-32C: a weights' checksum from its pieces'.
double FoldCrcs(const std::vector<uint32_t>& crcs);

struct WeightSyncCheck {
  double seconds = 0;
  // The weights' checksum: the trained pieces' CRCs in order, folded into one CRC-32C.
  double checksum = 0;
};

// Checks the rollout's weights `rollout` (a module of the trained model's architecture, any
// dtype per tensor) against `trained`'s; every rank of `pool` (the actor pool, the trained
// model's replicas) calls it together. DATA_LOSS naming every rank's first differing tensor.
absl::StatusOr<WeightSyncCheck> VerifyRolloutWeights(train::TrainedModel& trained,
                                                     model::Transformer& rollout,
                                                     parallel::Communicator& pool,
                                                     const at::Device& device, int64_t step);

// The dtype each parameter has in the rollout's weights, by name.
using RolloutDtypes = std::map<std::string, at::ScalarType>;
RolloutDtypes DtypesOf(model::Transformer& rollout);

// The pool's checksum of `trained`'s weights cast as the rollout holds them: what
// VerifyRolloutWeights reports once the rollout has these weights. Every rank of `pool` calls
// it together.
absl::StatusOr<double> TrainedWeightsChecksum(train::TrainedModel& trained,
                                              const RolloutDtypes& dtypes,
                                              parallel::Communicator& pool,
                                              const at::Device& device);

}  // namespace rlhfd::roles
