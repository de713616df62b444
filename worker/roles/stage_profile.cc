#include "worker/roles/stage_profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "common/util/files.h"

namespace rlhfd::roles {
namespace {

namespace profiler = torch::autograd::profiler;

// PyTorch's profiler is one per process: a worker runs one stage at a time, but a process
// hosting several role hosts (in-process tests) may not profile two stages at once.
std::atomic<bool> profiling{false};

// A stage's name as a file name: letters and digits, anything else '_'.
std::string FileName(std::string stage) {
  std::replace_if(
      stage.begin(), stage.end(), [](unsigned char c) { return !std::isalnum(c); }, '_');
  return stage.substr(0, 100);
}

}  // namespace

StageProfile::StageProfile(const v1::JobSpec& spec, int64_t step, const std::string& stage,
                           int rank) {
  const auto& steps = spec.trainer().profile_steps();
  if (spec.trainer().profile_dir().empty() ||
      std::find(steps.begin(), steps.end(), step) == steps.end()) {
    return;
  }
  const std::string dir = absl::StrCat(spec.trainer().profile_dir(), "/step_", step);
  if (const absl::Status made = MakeDirectories(dir); !made.ok()) {
    RLOG(WARNING) << "trainer.profile_dir: " << made.message() << "; stage " << stage
                  << " not profiled";
    return;
  }
  if (profiling.exchange(true)) {
    RLOG(WARNING) << "another stage of this process is being profiled; stage " << stage
                  << " is not";
    return;
  }
  try {
    const profiler::ProfilerConfig config(profiler::ProfilerState::KINETO);
    std::set<torch::profiler::impl::ActivityType> activities = {
        torch::profiler::impl::ActivityType::CPU};
    if (torch::cuda::is_available()) activities.insert(torch::profiler::impl::ActivityType::CUDA);
    profiler::prepareProfiler(config, activities);
    profiler::enableProfiler(config, activities);
    path_ = absl::StrCat(dir, "/", FileName(stage), "_rank_", rank, ".json");
  } catch (const std::exception& error) {
    RLOG(WARNING) << "the profiler did not start for stage " << stage << ": " << error.what();
    profiling = false;
  }
}

StageProfile::~StageProfile() {
  if (!path_) return;
  try {
    profiler::disableProfiler()->save(*path_);
    RLOG(INFO) << "profile of the stage written to " << *path_;
  } catch (const std::exception& error) {
    RLOG(WARNING) << "the profile for " << *path_ << " was not written: " << error.what();
  }
  profiling = false;
}

}  // namespace rlhfd::roles
