// A rollout pool of its own (roles.rollout, verl's standalone rollout): a rank that only
// generates. It holds the model in the rollout's dtype and the generation engine over it; its
// weights come from the actor before each rollout (PoolWeightSync, through the job's weights
// group), so it keeps no state of its own across steps and checkpoints nothing. Generation and
// the rows it leaves are the actor's hybrid engine's (generated_rows.h); the rows then move to the
// actor ranks.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "rlhfd/v1/worker_service.pb.h"
#include "worker/model/tokenizer.h"
#include "worker/model/transformer.h"
#include "worker/parallel/communicator.h"
#include "worker/roles/hybrid_engine.h"
#include "worker/roles/pool_weight_sync.h"
#include "worker/roles/step_batch.h"
#include "worker/rollout/engine.h"

namespace rlhfd::roles {

class RolloutRole {
 public:
  // Loads model.path in the rollout's dtype and the job's tokenizer on `device`; `pool` is the
  // rollout pool's communicator (P and R are agreed over it). Both must outlive the role.
  static absl::StatusOr<std::unique_ptr<RolloutRole>> Create(const v1::JobSpec& spec,
                                                             const at::Device& device,
                                                             parallel::Communicator& pool,
                                                             int64_t ranks_on_device);

  // Receives the actor's current weights (every rank of both pools together); refuses to
  // generate until one succeeds after a failed one.
  absl::StatusOr<std::map<std::string, double>> ReceiveWeights(PoolWeightSync& sync, int64_t step,
                                                               const RolloutWeightsHook& hook);
  // As ActorRole::Generate, over the weights received last.
  absl::StatusOr<v1::GenerateReply> Generate(const v1::GenerateRequest& request, int64_t total_rows,
                                             RowRange rows, StepBatch& batch);
  const model::Tokenizer& tokenizer() const { return tokenizer_; }
  // Frees the engine's cache (an offload, or the job's end).
  void Release() {
    if (engine_) engine_->Release();
  }

 private:
  RolloutRole(const v1::JobSpec& spec, const at::Device& device, model::Tokenizer tokenizer,
              model::Transformer module, parallel::Communicator& pool);

  v1::JobSpec spec_;
  at::Device device_;
  model::Tokenizer tokenizer_;
  model::Transformer module_;
  parallel::Communicator& pool_;
  std::unique_ptr<rollout::GenerationEngine> engine_;
  rollout::EngineOptions engine_options_;
  // Whether the weights are the actor's: false until the first transfer, and after one failed.
  bool synced_ = false;
};

}  // namespace rlhfd::roles
