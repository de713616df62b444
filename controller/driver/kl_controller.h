// The KL coefficient of a KL penalty in the reward (algorithm.kl with mode in_reward), kept by the
// driver from step to step: fixed, or adapted towards a target KL as verl's AdaptiveKLController
// (Ziegler et al.): coef *= 1 + clip(kl / target - 1, -0.2, 0.2) · samples / horizon.
#pragma once

#include <algorithm>
#include <cstdint>

#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::controller {

class KlController {
 public:
  explicit KlController(const v1::KlSpec& spec, double value)
      : adaptive_(spec.controller() == v1::KL_CONTROLLER_ADAPTIVE),
        value_(value),
        target_(spec.target()),
        horizon_(static_cast<double>(std::max<int64_t>(1, spec.horizon()))) {}

  double value() const { return value_; }

  // After a step that observed mean KL `kl` over `samples` responses.
  void Update(double kl, int64_t samples) {
    if (!adaptive_ || target_ <= 0) return;
    const double error = std::clamp(kl / target_ - 1.0, -0.2, 0.2);
    value_ *= 1.0 + error * static_cast<double>(samples) / horizon_;
  }

 private:
  bool adaptive_;
  double value_;
  double target_;
  double horizon_;
};

}  // namespace rlhfd::controller
