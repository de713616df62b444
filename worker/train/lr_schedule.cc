// LR schedules; see lr_schedule.h.
#include "worker/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace rlhfd::train {

LrSchedule::LrSchedule(const v1::TrainSpec& train, int64_t total_steps)
    : kind_(train.lr_schedule()),
      peak_(train.lr()),
      min_ratio_(train.min_lr_ratio()),
      warmup_(std::max<int64_t>(train.lr_warmup_steps(), 0)),
      total_(std::max<int64_t>(total_steps, 1)) {}

double LrSchedule::At(int64_t step) const {
  if (step < warmup_) return peak_ * static_cast<double>(step) / static_cast<double>(warmup_);
  const int64_t decay_steps = std::max<int64_t>(total_ - warmup_, 1);
  const double progress =
      std::clamp(static_cast<double>(step - warmup_) / static_cast<double>(decay_steps), 0.0, 1.0);
  double factor = 1.0;
  switch (kind_) {
    case v1::LR_SCHEDULE_COSINE:
      factor = min_ratio_ + (1 - min_ratio_) * 0.5 * (1 + std::cos(M_PI * progress));
      break;
    case v1::LR_SCHEDULE_LINEAR:
      factor = min_ratio_ + (1 - min_ratio_) * (1 - progress);
      break;
    default:
      break;
  }
  return peak_ * factor;
}

}  // namespace rlhfd::train
