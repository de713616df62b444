// The critic: a value model (critic.model_path, or model.path with a new value head, as verl
// makes one), its values over a step's rows, and its update.
#pragma once

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"
#include "rlhfd/v1/worker_service.pb.h"
#include "worker/parallel/communicator.h"
#include "worker/roles/hosted_role.h"
#include "worker/roles/step_batch.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/trained_model.h"

namespace rlhfd::roles {

class CriticRole final : public TrainedRole {
 public:
  static absl::StatusOr<std::unique_ptr<CriticRole>> Create(const v1::JobSpec& spec,
                                                            const at::Device& device,
                                                            parallel::Communicator& pool,
                                                            int64_t rl_steps);

  // values (rows, R).
  absl::Status ComputeValues(StepBatch& batch);
  // One value update towards the step's returns, clipped around its values.
  absl::StatusOr<v1::UpdateReply> Update(const v1::UpdateRequest& request, StepBatch& batch);

  train::TrainedModel& trained() override { return *trained_; }
  int64_t optimizer_steps() const override { return optimizer_steps_; }
  void set_optimizer_steps(int64_t steps) override { optimizer_steps_ = steps; }
  int64_t nonfinite_skips() const override { return nonfinite_skips_; }
  void set_nonfinite_skips(int64_t skips) override { nonfinite_skips_ = skips; }

 private:
  CriticRole(const v1::JobSpec& spec, const at::Device& device) : spec_(spec), device_(device) {}

  v1::JobSpec spec_;
  at::Device device_;
  std::unique_ptr<train::TrainedModel> trained_;
  std::optional<train::LrSchedule> schedule_;
  int64_t optimizer_steps_ = 0;
  int64_t nonfinite_skips_ = 0;
};

}  // namespace rlhfd::roles
