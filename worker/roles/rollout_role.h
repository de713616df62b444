// A rollout pool of its own (roles.rollout, verl's standalone rollout): a rank that only
// generates. At rollout tp 1 it holds the model in the rollout's dtype and the generation engine
// over it; at tp > 1 only its tensor-parallel slices, generating with its group as the hybrid
// engine does (GenerateOverSlices). Its weights come from the actor before each rollout
// (PoolWeightSync, through the job's weights group), so it keeps no state of its own across
// steps and checkpoints nothing. Generation and
// the rows it leaves are the actor's hybrid engine's (generated_rows.h); the rows then move to the
// actor ranks.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "rlhfd/v1/worker_service.pb.h"
#include "worker/model/tokenizer.h"
#include "worker/model/transformer.h"
#include "worker/parallel/communicator.h"
#include "worker/roles/hybrid_engine.h"
#include "worker/roles/job_layout.h"
#include "worker/roles/pool_weight_sync.h"
#include "worker/roles/step_batch.h"
#include "worker/rollout/engine.h"

namespace rlhfd::roles {

class RolloutRole {
 public:
  // Loads the job's tokenizer and model.path (at tp 1 its weights, in the rollout's dtype; at
  // tp > 1 its config, the tensor-parallel group split from `pool`) on `device`; `pool` is the
  // rollout pool's communicator (P and R are agreed over it). Both must outlive the role.
  static absl::StatusOr<std::unique_ptr<RolloutRole>> Create(const v1::JobSpec& spec,
                                                             const at::Device& device,
                                                             const JobLayout& layout,
                                                             parallel::Communicator& pool,
                                                             int64_t ranks_on_device);

  // Receives the actor's current weights (every rank of both pools together); refuses to
  // generate until one succeeds after a failed one.
  absl::StatusOr<std::map<std::string, double>> ReceiveWeights(PoolWeightSync& sync, int64_t step,
                                                               const RolloutWeightsHook& hook);
  // As ActorRole::Generate, over the weights received last.
  absl::StatusOr<v1::GenerateReply> Generate(const v1::GenerateRequest& request, int64_t total_rows,
                                             RowRange rows, StepBatch& batch);

 private:
  // Frees the engine's cache: before new weights arrive (the engine reads them when it makes its
  // cache again), and once a rollout's rows are laid out.
  void Release() {
    if (engine_) engine_->Release();
  }
  RolloutRole(const v1::JobSpec& spec, const at::Device& device, model::Tokenizer tokenizer,
              model::ModelConfig config, parallel::Communicator& pool);
  // The responses to `requests` over the weights received last.
  absl::StatusOr<std::vector<rollout::GenerationResult>> Rollout(
      const std::vector<rollout::GenerationRequest>& requests);

  v1::JobSpec spec_;
  at::Device device_;
  model::Tokenizer tokenizer_;
  model::ModelConfig config_;
  RolloutDtypes dtypes_;  // each parameter's, as the weights arrive
  parallel::Communicator& pool_;
  // tp 1: the whole model; tp > 1: the group and this rank's slices.
  std::optional<model::Transformer> module_;
  std::unique_ptr<parallel::Communicator> tp_group_;
  std::map<std::string, at::Tensor> slices_;
  bool path_logged_ = false;
  std::unique_ptr<rollout::GenerationEngine> engine_;
  rollout::EngineOptions engine_options_;
  // Whether the weights are the actor's: false until the first transfer, and after one failed.
  bool synced_ = false;
};

}  // namespace rlhfd::roles
