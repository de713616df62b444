// A rollout pool of its own (roles.rollout, verl's standalone rollout): a rank that only
// generates. At rollout tp 1 it holds the model in the rollout's dtype and the generation engine
// over it; at tp > 1 only its tensor-parallel slices, generating with its group as the hybrid
// engine does (GenerateOverSlices). Its weights come from the actor before each rollout
// (PoolWeightSync, through the job's weights group), so it keeps no state of its own across
// steps and checkpoints nothing. Generation and
// the rows it leaves are the actor's hybrid engine's (generated_rows.h); the rows then move to the
// actor ranks.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "rlhfd/v1/worker_service.pb.h"
#include "worker/model/tokenizer.h"
#include "worker/model/transformer.h"
#include "worker/parallel/communicator.h"
#include "worker/roles/generated_rows.h"
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
  // `decode_step_hold`: drills and tests (RoleHostOptions::fault_hold_rollout_decode_step).
  static absl::StatusOr<std::unique_ptr<RolloutRole>> Create(
      const v1::JobSpec& spec, const at::Device& device, const JobLayout& layout,
      parallel::Communicator& pool, int64_t ranks_on_device,
      absl::Duration decode_step_hold = absl::ZeroDuration());

  // Receives the actor's current weights, those after step `weights_step`'s update (every rank of
  // both pools together); refuses to generate until one succeeds after a failed one.
  absl::StatusOr<std::map<std::string, double>> ReceiveWeights(PoolWeightSync& sync, int64_t step,
                                                               int64_t weights_step,
                                                               const RolloutWeightsHook& hook);
  // As ActorRole::Generate, over the weights received last. trainer.mode async also records each
  // token's weights (rollout_weights_step); with roles.rollout.partial_rollout, the call stops
  // once `queued_pool_calls` is above 0 and replies with the count of unfinished responses,
  // which a call with `resume` continues (after the queued calls, on the weights they left).
  absl::StatusOr<v1::GenerateReply> Generate(const v1::GenerateRequest& request, int64_t total_rows,
                                             RowRange rows, StepBatch& batch,
                                             const std::atomic<int64_t>* queued_pool_calls);

 private:
  // Frees the engine's cache: before new weights arrive (the engine reads them when it makes its
  // cache again), and once a rollout's rows are laid out.
  void Release() {
    if (engine_) engine_->Release();
  }
  RolloutRole(const v1::JobSpec& spec, const at::Device& device, model::Tokenizer tokenizer,
              model::ModelConfig config, parallel::Communicator& pool);
  // The responses to `requests` over the weights received last (interrupted as the engine's
  // Generate says); the sequences the engine preempted are added to `preemptions`.
  absl::StatusOr<std::vector<rollout::GenerationResult>> Rollout(
      const std::vector<rollout::GenerationRequest>& requests, int64_t& preemptions,
      const std::atomic<int64_t>* interrupt = nullptr);
  RowsGenerator Generator();
  // trainer.mode async: a rollout made in parts, each part on the weights of its time.
  absl::StatusOr<v1::GenerateReply> GenerateInParts(const v1::GenerateRequest& request,
                                                    int64_t total_rows, RowRange rows,
                                                    StepBatch& batch,
                                                    const std::atomic<int64_t>* interrupt);

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
  int64_t weights_step_ = 0;  // the step whose update they include
  // trainer.mode async: the step's rollout so far, between an interrupted call and its resume.
  struct PartialRollout {
    v1::GenerateRequest request;  // the first call's
    PromptRequests encoded;
    std::vector<rollout::GenerationResult> results;  // interrupted responses as they stand
    TokenWeightsSteps weights_steps;
    int64_t interruptions = 0;
    int64_t preemptions = 0;  // over its calls
    double generating_s = 0;  // the calls' own time, without the pauses between them
  };
  std::optional<PartialRollout> partial_;
};

}  // namespace rlhfd::roles
