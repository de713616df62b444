#include "worker/roles/frozen_roles.h"

#include <optional>

#include "common/status/status_macros.h"
#include "worker/model/lora.h"
#include "worker/model/model_loader.h"
#include "worker/roles/forward_passes.h"
#include "worker/roles/training_setup.h"

namespace rlhfd::roles {
namespace {

model::LoadOptions FrozenLoadOptions(const v1::JobSpec& spec, const at::Device& device,
                                     model::HeadNeed head) {
  model::LoadOptions load;
  load.dtype = WeightDtype(spec, device, /*trains=*/false);
  load.device = device;
  load.head = head;
  load.max_sequence_length = spec.data().max_prompt_length() + spec.data().max_response_length();
  load.sequence_what = "data.max_prompt_length + data.max_response_length";
  return load;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ReferenceRole>> ReferenceRole::Create(
    const v1::JobSpec& spec, const at::Device& device, model::Transformer* lora_base) {
  if (lora_base != nullptr) {
    return std::unique_ptr<ReferenceRole>(
        new ReferenceRole(spec, device, *lora_base, /*shares_actor=*/true));
  }
  ASSIGN_OR_RETURN(model::Transformer module,
                   model::LoadModel(spec.model().path(),
                                    FrozenLoadOptions(spec, device, model::HeadNeed::kCausalLm)));
  for (at::Tensor& p : module->parameters()) p.requires_grad_(false);
  return std::unique_ptr<ReferenceRole>(
      new ReferenceRole(spec, device, std::move(module), /*shares_actor=*/false));
}

absl::Status ReferenceRole::ComputeLogProbs(StepBatch& batch) {
  ASSIGN_OR_RETURN(const at::Tensor ids, batch.Get("input_ids", "reference log-probs"));
  ASSIGN_OR_RETURN(const at::Tensor mask, batch.Get("attention_mask", "reference log-probs"));
  ComputeScope compute(spec_, device_);
  std::optional<model::AdaptersOff> base;
  if (shares_actor_) base.emplace(module_);
  ASSIGN_OR_RETURN(
      at::Tensor log_probs,
      ResponseLogProbs(module_, ids, mask, batch.prompt_length(),
                       ReferenceLogProbForwards(spec_, !module_->PacksWithVarlenAttention(device_)),
                       LogProbTemperature(spec_)));
  return batch.Put("ref_log_probs", std::move(log_probs));
}

absl::StatusOr<std::unique_ptr<RewardModelRole>> RewardModelRole::Create(const v1::JobSpec& spec,
                                                                         const at::Device& device) {
  ASSIGN_OR_RETURN(model::Transformer module,
                   model::LoadModel(spec.roles().reward().model(),
                                    FrozenLoadOptions(spec, device, model::HeadNeed::kScore)));
  for (at::Tensor& p : module->parameters()) p.requires_grad_(false);
  return std::unique_ptr<RewardModelRole>(new RewardModelRole(spec, device, std::move(module)));
}

absl::Status RewardModelRole::ComputeScores(StepBatch& batch) {
  ASSIGN_OR_RETURN(const at::Tensor ids, batch.Get("input_ids", "reward-model scores"));
  ASSIGN_OR_RETURN(const at::Tensor mask, batch.Get("attention_mask", "reward-model scores"));
  RETURN_IF_ERROR(model::CheckTokenIds(ids, module_->config().vocab_size,
                                       "the responses, with the reward model's vocabulary"));
  ComputeScope compute(spec_, device_);
  // Forwards as large as the actor's log-prob forwards; they pad their rows, and the reward
  // model's weights are whole on every rank (no lockstep).
  ASSIGN_OR_RETURN(
      at::Tensor scores,
      SequenceScores(module_, ids, mask, ActorLogProbForwards(spec_, /*padded=*/true, nullptr)));
  return batch.Put("scores", std::move(scores));
}

}  // namespace rlhfd::roles
