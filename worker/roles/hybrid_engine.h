// The actor's hybrid engine: the training layout's weights are the source of truth; a rollout
// runs the generation engine over them (over a copy gathered or cast into the rollout's dtype
// when the training module cannot serve), or with rollout tp > 1 the tensor-parallel group's
// generation over slices cut from them (on GPUs, for models it serves, the engine's fused decode
// over the slices; otherwise a forward over whole prefixes per token:
// tensor_parallel_generation.h). The KV cache and the copy's storage are released before the
// weights train again.
#pragma once

#include <ATen/Device.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "worker/model/transformer.h"
#include "worker/parallel/communicator.h"
#include "worker/parallel/reshard.h"
#include "worker/parallel/tensor_parallel.h"
#include "worker/roles/job_layout.h"
#include "worker/roles/weight_sync.h"
#include "worker/rollout/engine.h"
#include "worker/rollout/tensor_parallel_generation.h"
#include "worker/train/trained_model.h"

namespace rlhfd::roles {

// rollout tp > 1: this rank's tensor-parallel group within `role`'s pool `pool` (the actor's,
// or a rollout pool of its own), at the place JobLayout::TensorParallelPlaceIn gives it (rollout
// rank k * tp + j is slice j of group k, reshard.h's numbering); null for tp 1. tp must divide
// the pool.
absl::StatusOr<std::unique_ptr<parallel::Communicator>> SplitRolloutGroup(
    const v1::JobSpec& spec, const JobLayout& layout, v1::Role role, parallel::Communicator& pool);

// Generates `gathered.all` (GatherGroupRequests over `group`) over this rank's tensor-parallel
// `slices`, every rank of the group together, and returns this rank's `count` results: on GPUs,
// for models it serves, the engine's fused decode with a KV cache of this rank's heads;
// otherwise a forward over whole prefixes per token (tensor_parallel_generation.h). `ready` runs
// once the model over the slices is made; the path is logged once (`path_logged`).
// Adds the sequences the engine preempted to `preemptions`.
absl::StatusOr<std::vector<rollout::GenerationResult>> GenerateOverSlices(
    const model::ModelConfig& config, std::map<std::string, at::Tensor> slices,
    parallel::Communicator& group, const rollout::EngineOptions& options,
    const rollout::GroupRequests& gathered, size_t count, bool* path_logged,
    const std::function<void()>& ready, int64_t& preemptions);

// engine.Generate, adding the sequences it preempted for lack of KV cache blocks to
// `preemptions` and warning of them (they cost time: their contexts are prefilled again).
absl::StatusOr<std::vector<rollout::GenerationResult>> GenerateCountingPreemptions(
    rollout::GenerationEngine& engine, const std::vector<rollout::GenerationRequest>& requests,
    rollout::TurnHandler* turns, const std::atomic<int64_t>* interrupt, int64_t& preemptions);

// The generation engine's options from the job's rollout spec, the cache's share of the GPU
// divided among `sharing` ranks on one GPU (rollout::RanksOnThisDevice).
rollout::EngineOptions RolloutEngineOptions(const v1::JobSpec& spec, int64_t sharing);

// roles.actor.rollout.update_weights_bucket_megabytes, in bytes.
int64_t UpdateBucketBytes(const v1::JobSpec& spec);

// Tests: called on each actor rank with the rollout's weights by name right after they are
// brought up to date, before any check, to corrupt them as a faulty transfer would. `resharded`:
// the tensor-parallel slices resharded from ZeRO-3 shards (or, on a rollout pool's rank, the
// weights received from the actor ranks), else the (gathered or cast) copy or the training module
// the rollout reads. `pool_rank`: the rank in the pool that generates.
using RolloutWeightsHook = std::function<void(
    bool resharded, const std::map<std::string, at::Tensor>& weights, int pool_rank)>;

class HybridEngine {
 public:
  // `pool` (the actor pool) and `trained` must outlive the engine; `tp_group` comes from
  // SplitRolloutGroup. `ranks_on_device`: the pool's ranks on this rank's GPU
  // (rollout::RanksOnThisDevice); at rollout tp 1 each takes that share of the cache budget.
  HybridEngine(const v1::JobSpec& spec, const at::Device& device, parallel::Communicator& pool,
               train::TrainedModel& trained, std::unique_ptr<parallel::Communicator> tp_group,
               int64_t ranks_on_device, RolloutWeightsHook hook = nullptr);

  // Generates step `step`'s `requests` over the current weights (with tp > 1 every rank of the
  // group calls it together, each with its own requests), first checking them against the
  // trained ones when trainer.verify_weight_sync asks (weight_sync.h). A library error releases
  // the rollout state. `turns`: multi-turn rollouts (tp 1 only; GenerationEngine::Generate).
  absl::StatusOr<std::vector<rollout::GenerationResult>> Generate(
      const std::vector<rollout::GenerationRequest>& requests, int64_t step,
      rollout::TurnHandler* turns = nullptr);
  // The check of the last Generate; none when it was not due.
  const std::optional<WeightSyncCheck>& last_check() const { return last_check_; }
  // What the reshard from ZeRO-3 shards moves per rollout; none without one.
  const parallel::ReshardStats* reshard_stats() const {
    return reshard_ ? &reshard_->stats() : nullptr;
  }
  // The pool's checksum of the trained weights as the rollout will hold them (every rank of the
  // pool calls it together): what the check of the next rollout over them reports.
  absl::StatusOr<double> TrainedWeightsChecksum();
  // Frees the engine's KV cache (the update needs the memory); the weights' copy stays.
  void ReleaseCache();
  // Frees the engine's cache and the storage of any copy of the weights.
  void Release();
  // A module with the full current weights (the training module itself unless the layout
  // shards them), for exports.
  absl::StatusOr<model::Transformer> FullWeights() { return WeightsIn(at::kFloat); }
  // Seconds the last rollout took to bring its weights up to date (verl's
  // timing_s/update_weights).
  double weights_update_s() const { return weights_update_s_; }
  // Sequences the last rollout preempted for lack of KV cache blocks.
  int64_t preemptions() const { return preemptions_; }

 private:
  // The engine over the current weights (a copy gathered or cast when the layout needs one).
  absl::StatusOr<rollout::GenerationEngine*> Engine(int64_t step);
  // The engine's options from the job's rollout spec.
  rollout::EngineOptions RolloutEngineOptions() const;
  // A module with the current weights in `dtype`: the training module when it holds them whole
  // in that dtype, else a copy.
  absl::StatusOr<model::Transformer> WeightsIn(at::ScalarType dtype);
  // The rollout's weights brought up to date, and checked when `step`'s check is due.
  absl::StatusOr<model::Transformer> RolloutWeights(int64_t step);
  absl::StatusOr<std::vector<rollout::GenerationResult>> GenerateTensorParallel(
      const std::vector<rollout::GenerationRequest>& requests, int64_t step);
  // This rank's tensor-parallel slices of the current weights, by name: resharded from the
  // ZeRO-3 shards (and, on a checked step, held to the slices of the gathered weights), else cut
  // from the weights this rank holds whole.
  absl::StatusOr<std::map<std::string, at::Tensor>> TensorParallelSlices(int64_t step);
  // The ZeRO-3 shards resharded to this rank's parts of `specs` at `layout` (the whole weights at
  // tp 1), each in its dtype of `dtypes`; the plan is made at the first call.
  absl::StatusOr<std::map<std::string, at::Tensor>> Reshard(
      const std::vector<parallel::ShardedParameter>& specs, const parallel::RolloutLayout& layout,
      const std::vector<at::ScalarType>& dtypes);
  // Frees the copy's storage.
  void ReleaseCopy();

  const v1::JobSpec& spec_;
  at::Device device_;
  parallel::Communicator& pool_;
  train::TrainedModel& trained_;
  // A copy of the weights for the rollout (or an export) when the training module cannot serve:
  // its module lives on, its storage only while in use.
  std::optional<model::Transformer> copy_;
  at::ScalarType copy_dtype_ = at::kFloat;
  std::vector<std::pair<std::vector<int64_t>, at::ScalarType>> copy_shapes_;
  bool copy_held_ = false;
  std::unique_ptr<rollout::GenerationEngine> engine_;
  int64_t ranks_on_device_;
  // rollout tp > 1: the group.
  std::unique_ptr<parallel::Communicator> tp_group_;
  bool path_logged_ = false;   // the tensor-parallel generation's path, logged once
  bool cache_logged_ = false;  // the tp 1 rollout's cache on a GPU, logged once
  // ZeRO-3: the plan moving shards to slices (rollout tp > 1) or to the rollout's whole copy
  // (tp 1, made in reshard_dtype_; a copy in another dtype, an export's, is gathered), made at
  // the first rollout.
  std::optional<parallel::ReshardPlan> reshard_;
  at::ScalarType reshard_dtype_ = at::kFloat;
  double reshard_s_ = -1;  // the last rollout's reshard, when it had one
  double weights_update_s_ = 0;
  int64_t preemptions_ = 0;
  std::optional<WeightSyncCheck> last_check_;
  RolloutWeightsHook hook_;
};

}  // namespace rlhfd::roles
