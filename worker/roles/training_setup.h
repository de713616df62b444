// What the actor and critic share: the training layout a TrainSpec asks for, its optimiser, its
// update-loop options and each role's update options, and the compute precision of a role's
// forwards.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "rlhfd/v1/worker_service.pb.h"
#include "worker/model/transformer.h"
#include "worker/parallel/communicator.h"
#include "worker/train/critic_update.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/policy_update.h"
#include "worker/train/trained_model.h"
#include "worker/train/update_loop.h"

namespace rlhfd::roles {

// One process (a pool of one), ZeRO-2 (zero_stage 1 or 2) or ZeRO-3 over `pool`, which must
// outlive the model. A module with LoRA adapters trains them with ZeRO-2 at any zero_stage.
std::unique_ptr<train::TrainedModel> MakeTrainedModel(model::Transformer module,
                                                      const v1::TrainSpec& train,
                                                      parallel::Communicator& pool);

// Whether the job's actor trains LoRA adapters (model.lora_rank or model.lora_adapter_path).
bool UsesLora(const v1::JobSpec& spec);

// The job's LoRA adapters on the actor's `module`: model.lora_rank, lora_alpha and
// target_modules, fresh (seeded with trainer.seed, so every replica and a resumed run draw the
// same), or read from model.lora_adapter_path, whose rank, alpha and layers the job takes when
// lora_rank is 0 and must equal otherwise (errors name both). Returns the options.
absl::StatusOr<model::LoraOptions> AddJobLoraAdapters(const v1::JobSpec& spec,
                                                      model::Transformer& module);

// Optimiser steps one RL step takes: mini-batches per step times PPO epochs.
int64_t OptimizerStepsPerRlStep(const v1::JobSpec& spec, const v1::TrainSpec& train);

// The loop of one update of `role`: per-replica mini-batches of ppo_mini_batch_size x n / dp
// responses, micro-batches by count or token budget (packed forwards), the schedule from
// `first_step`, and trainer.max_nonfinite_skips less the `nonfinite_skips` the run took so far.
train::UpdateLoopOptions UpdateLoopOptionsOf(const v1::JobSpec& spec, v1::Role role,
                                             const v1::TrainSpec& train, int replicas,
                                             int64_t rl_step, const train::LrSchedule* schedule,
                                             int64_t first_step, int64_t nonfinite_skips);

// The temperature the actor's and reference's log-probs are taken at: the rollout's sampling
// temperature, 1 for a greedy rollout (temperature 0), as verl divides its logits; 1 in
// trainer.mode sft (the data's tokens, not samples).
double LogProbTemperature(const v1::JobSpec& spec);

// The actor's update options: the loop of UpdateLoopOptionsOf, the policy loss's clip ratios and
// aggregation, the entropy bonus, and the KL loss (its weight 0 unless algorithm.kl asks for a
// loss with a positive coefficient).
train::PolicyUpdateOptions PolicyUpdateOptionsOf(const v1::JobSpec& spec, int replicas,
                                                 int64_t rl_step, const train::LrSchedule* schedule,
                                                 int64_t first_step, int64_t nonfinite_skips);

// The critic's: the loop of UpdateLoopOptionsOf, cliprange_value and the loss aggregation.
train::CriticUpdateOptions CriticUpdateOptionsOf(const v1::JobSpec& spec, int replicas,
                                                 int64_t rl_step, const train::LrSchedule* schedule,
                                                 int64_t first_step, int64_t nonfinite_skips);

// The dtype a role's weights are loaded in: float32 on the CPU; on a GPU float32 masters for
// roles that train, model.dtype for frozen ones.
at::ScalarType WeightDtype(const v1::JobSpec& spec, const at::Device& device, bool trains);

// Autocast to model.dtype for the scope on a GPU (float32 weights computing in bf16, as verl's
// FSDP mixed precision); nothing on the CPU.
class ComputeScope {
 public:
  ComputeScope(const v1::JobSpec& spec, const at::Device& device);
  ~ComputeScope();
  ComputeScope(const ComputeScope&) = delete;
  ComputeScope& operator=(const ComputeScope&) = delete;

 private:
  bool enabled_ = false;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kBFloat16;
};

}  // namespace rlhfd::roles
