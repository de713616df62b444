#include "worker/roles/critic_role.h"

#include "common/status/status_macros.h"
#include "worker/model/model_loader.h"
#include "worker/roles/forward_passes.h"
#include "worker/roles/training_setup.h"
#include "worker/train/critic_update.h"

namespace rlhfd::roles {

absl::StatusOr<std::unique_ptr<CriticRole>> CriticRole::Create(const v1::JobSpec& spec,
                                                               const at::Device& device,
                                                               parallel::Communicator& pool,
                                                               int64_t rl_steps) {
  const v1::CriticSpec& critic = spec.roles().critic();
  model::LoadOptions load;
  load.dtype = WeightDtype(spec, device, /*trains=*/true);
  load.device = device;
  load.head = model::HeadNeed::kScore;
  load.fresh_score_head = true;  // a causal-LM directory gets a new value head
  load.seed = static_cast<uint64_t>(spec.trainer().seed());
  load.max_sequence_length =
      spec.data().max_prompt_length() + spec.data().max_response_length();
  load.sequence_what = "data.max_prompt_length + data.max_response_length";
  const std::string& dir = critic.model_path().empty() ? spec.model().path() : critic.model_path();
  ASSIGN_OR_RETURN(model::Transformer module, model::LoadModel(dir, load));
  module->train();
  auto role = std::unique_ptr<CriticRole>(new CriticRole(spec, device));
  role->trained_ = MakeTrainedModel(std::move(module), critic.train(), pool);
  role->schedule_.emplace(critic.train(),
                          std::max<int64_t>(1, rl_steps * OptimizerStepsPerRlStep(spec, critic.train())));
  return role;
}

absl::Status CriticRole::ComputeValues(StepBatch& batch) {
  ASSIGN_OR_RETURN(const at::Tensor ids, batch.Get("input_ids", "values"));
  ASSIGN_OR_RETURN(const at::Tensor mask, batch.Get("attention_mask", "values"));
  ComputeScope compute(spec_, device_);
  RETURN_IF_ERROR(trained_->BeginStep());
  absl::StatusOr<at::Tensor> values = ResponseValues(
      trained_->module(), ids, mask, batch.prompt_length(),
      CriticValueForwards(spec_, !trained_->module()->PacksWithVarlenAttention(device_),
                          trained_.get()));
  trained_->EndForwards();
  RETURN_IF_ERROR(trained_->TakeStatus());
  if (!values.ok()) return values.status();
  return batch.Put("values", *values);
}

absl::StatusOr<v1::UpdateReply> CriticRole::Update(const v1::UpdateRequest& request,
                                                   StepBatch& batch) {
  const int64_t p = batch.prompt_length();
  train::CriticUpdateBatch update;
  ASSIGN_OR_RETURN(update.input_ids, batch.Get("input_ids", "the critic update"));
  ASSIGN_OR_RETURN(update.attention_mask, batch.Get("attention_mask", "the critic update"));
  ASSIGN_OR_RETURN(const at::Tensor response_mask, batch.Get("response_mask", "the critic update"));
  ASSIGN_OR_RETURN(const at::Tensor values, batch.Get("values", "the critic update"));
  ASSIGN_OR_RETURN(const at::Tensor returns, batch.Get("returns", "the critic update"));
  update.response_mask = ToTrainingLayout(response_mask, p);
  update.old_values = ToTrainingLayout(values, p);
  update.returns = ToTrainingLayout(returns, p);
  const train::CriticUpdateOptions options =
      CriticUpdateOptionsOf(spec_, trained_->replicas(), request.key().step(), &*schedule_,
                            request.optimizer_steps_before(), nonfinite_skips_);
  ComputeScope compute(spec_, device_);
  ASSIGN_OR_RETURN(const train::UpdateMetrics metrics, train::UpdateCritic(*trained_, update, options));
  // The gradients are spent: their memory goes back before the next rollout.
  trained_->ZeroGrad();
  v1::UpdateReply reply;
  for (const auto& [name, value] : metrics) (*reply.mutable_metrics())[name] = value;
  optimizer_steps_ = request.optimizer_steps_before() +
                     static_cast<int64_t>(metrics.count("optimizer_steps") ? metrics.at("optimizer_steps") : 0);
  reply.set_optimizer_steps(optimizer_steps_);
  if (const auto skips = metrics.find("nonfinite_skips"); skips != metrics.end()) {
    nonfinite_skips_ += static_cast<int64_t>(skips->second);
  }
  return reply;
}

}  // namespace rlhfd::roles
