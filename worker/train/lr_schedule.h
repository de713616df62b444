// Learning-rate schedules as verl and transformers define them: linear warm-up from 0, then
// constant, cosine or linear decay to min_lr_ratio · lr at the last step.
#pragma once

#include <cstdint>

#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::train {

class LrSchedule {
 public:
  // `total_steps`: optimiser steps of the whole run (>= 1).
  LrSchedule(const v1::TrainSpec& train, int64_t total_steps);
  // Learning rate for optimiser step `step` (0-based).
  double At(int64_t step) const;

 private:
  v1::LrSchedule kind_;
  double peak_;
  double min_ratio_;
  int64_t warmup_;
  int64_t total_;
};

}  // namespace rlhfd::train
