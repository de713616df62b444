// trainer.profile_steps: PyTorch's profiler (Kineto: host ops, and kernels on a GPU) around one
// stage call of a profiled step, its Chrome trace written to
// <trainer.profile_dir>/step_<N>/<stage>_rank_<r>.json, where summarize_trace.py reads it. A
// profile that cannot start or be written costs the stage nothing: it is logged and dropped.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::roles {

class StageProfile {
 public:
  // Starts profiling when `step` is one of the job's profile_steps; else does nothing.
  StageProfile(const v1::JobSpec& spec, int64_t step, const std::string& stage, int rank);
  // Stops profiling and writes the trace (the stage's end).
  ~StageProfile();
  StageProfile(const StageProfile&) = delete;
  StageProfile& operator=(const StageProfile&) = delete;

 private:
  std::optional<std::string> path_;  // set while profiling
};

}  // namespace rlhfd::roles
