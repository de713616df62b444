// The roles that only run forwards: the reference policy (its log-probs, for the KL) and a
// reward model (a *ForSequenceClassification score at each row's last token). Their weights
// load in model.dtype and never change.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "worker/model/transformer.h"
#include "worker/roles/hosted_role.h"
#include "worker/roles/step_batch.h"

namespace rlhfd::roles {

class ReferenceRole final : public HostedRole {
 public:
  // `lora_base`: the LoRA actor's module on this worker (ActorRole::LoraBase), whose base with
  // the adapters off is the reference model (model.path): it is used instead of a second copy
  // of the weights. Null: the reference loads its own.
  static absl::StatusOr<std::unique_ptr<ReferenceRole>> Create(
      const v1::JobSpec& spec, const at::Device& device, model::Transformer* lora_base = nullptr);
  // ref_log_probs (rows, R).
  absl::Status ComputeLogProbs(StepBatch& batch);
  model::Transformer& module() { return module_; }
  // The actor's, when shared, are the actor's to report.
  std::vector<at::Tensor> ResidentTensors() override {
    return shares_actor_ ? std::vector<at::Tensor>() : module_->parameters();
  }
  bool shares_actor() const { return shares_actor_; }

 private:
  ReferenceRole(const v1::JobSpec& spec, const at::Device& device, model::Transformer module,
                bool shares_actor)
      : spec_(spec), device_(device), module_(std::move(module)), shares_actor_(shares_actor) {}
  v1::JobSpec spec_;
  at::Device device_;
  model::Transformer module_;
  bool shares_actor_ = false;
};

class RewardModelRole final : public HostedRole {
 public:
  static absl::StatusOr<std::unique_ptr<RewardModelRole>> Create(const v1::JobSpec& spec,
                                                                 const at::Device& device);
  // scores (rows).
  absl::Status ComputeScores(StepBatch& batch);
  model::Transformer& module() { return module_; }
  std::vector<at::Tensor> ResidentTensors() override { return module_->parameters(); }

 private:
  RewardModelRole(const v1::JobSpec& spec, const at::Device& device, model::Transformer module)
      : spec_(spec), device_(device), module_(std::move(module)) {}
  v1::JobSpec spec_;
  at::Device device_;
  model::Transformer module_;
};

}  // namespace rlhfd::roles
