// The checks of trainer.mode sft: the data's keys, and what a supervised step has no use for,
// refused naming the setting to drop.
#pragma once

#include "common/config/config_checker.h"
#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::config {

void CheckSupervised(Checker& check, const v1::JobSpec& spec);

}  // namespace rlhfd::config
