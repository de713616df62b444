// Advantage estimators behind one small interface, one class per row of
// common/algorithms/algorithm_traits.h's kEstimators (which says what each needs). Definitions
// follow verl's core_algos so results match a verl run.
//
// Shapes: B = sequences, T = response tokens (right-padded); `mask` (B, T) is 1 on real tokens.
#pragma once

#include <ATen/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::train {

struct AdvantageInput {
  at::Tensor token_rewards;  // (B, T): the sequence reward on its last token, KL penalties, ...
  at::Tensor mask;           // (B, T)
  at::Tensor values;         // (B, T) critic values (gae)
  at::Tensor group;          // (B) int64: the prompt each response answers (grpo, rloo, ++baseline)
  at::Tensor baseline;       // (B) reward of the greedy response (remax)
  double gamma = 1.0;
  double lam = 1.0;
  bool norm_adv_by_std = true;  // grpo
  double epsilon = 1e-6;
};

struct AdvantageOutput {
  at::Tensor advantages;  // (B, T), zero on padding
  at::Tensor returns;     // (B, T): the critic's targets (gae), else what the estimator defines
};

class AdvantageEstimator {
 public:
  virtual ~AdvantageEstimator() = default;
  // INVALID_ARGUMENT names the input the estimator needs and did not get.
  virtual absl::StatusOr<AdvantageOutput> Compute(const AdvantageInput& input) const = 0;
};

// The estimator registered for `estimator`; INVALID_ARGUMENT for one that is not.
absl::StatusOr<std::unique_ptr<AdvantageEstimator>> MakeAdvantageEstimator(
    v1::AdvantageEstimator estimator);

// (x - mean) / sqrt(var + 1e-8) over masked entries, with the unbiased variance (verl's
// masked_whiten). Padding stays as computed; callers multiply by the mask.
at::Tensor MaskedWhiten(const at::Tensor& x, const at::Tensor& mask);

}  // namespace rlhfd::train
