#include "worker/roles/background_save.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <sched.h>
#include <unistd.h>

#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging/logging.h"
#include "worker/roles/checkpoint.h"

namespace rlhfd::roles {

std::unique_ptr<BackgroundSave> BackgroundSave::Start(std::string dir, int64_t step,
                                                      CheckpointWriter writer,
                                                      std::vector<Part> parts, Around around) {
  int64_t copied_bytes = 0;
  for (Part& part : parts) {
    for (auto& [name, tensor] : part.state) {
      // A copy even where the tensor already lives on the host: training updates it in place.
      tensor = tensor.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
      copied_bytes += static_cast<int64_t>(tensor.nbytes());
    }
  }
  std::unique_ptr<BackgroundSave> save(new BackgroundSave(step, copied_bytes));
  save->thread_ = std::thread([save = save.get(), dir = std::move(dir), writer = std::move(writer),
                               parts = std::move(parts), around = std::move(around)]() {
    // The write takes only the CPU time training leaves (SCHED_IDLE for this thread): at nice 0,
    // or even 19, it slowed the next step's rollout by 2-3 ms of the CPU demo's 40 ms step
    // (docs/PERFORMANCE.md). LibTorch's check here (FirstNonFinite) runs on the worker's
    // --cpu_threads rather than on an OpenMP team of every core this new thread would make.
    at::init_num_threads();
    sched_param idle{};
    sched_setscheduler(gettid(), SCHED_IDLE, &idle);
    if (around.hold > absl::ZeroDuration()) {
      RLOG(WARNING) << "--fault_hold_background_save: the save of step " << save->step_
                    << " starts writing in " << around.hold;
      absl::SleepFor(around.hold);
    }
    absl::StatusOr<int64_t> written = 0;
    try {
      if (absl::Status done = around.first ? around.first() : absl::OkStatus(); !done.ok()) {
        written = done;
      }
      for (const Part& part : parts) {
        if (!written.ok()) break;
        const absl::StatusOr<int64_t> bytes =
            SaveRoleState(dir, save->step_, part.role, part.rank, part.state, part.extra, writer);
        written = bytes.ok() ? absl::StatusOr<int64_t>(*written + *bytes) : bytes.status();
        if (written.ok() && around.then) {
          if (absl::Status done = around.then(part); !done.ok()) written = done;
        }
      }
    } catch (const std::exception& error) {
      written = absl::InternalError(
          absl::StrCat("the background save of step ", save->step_, " failed: ", error.what()));
    }
    save->written_ = std::move(written);
  });
  return save;
}

BackgroundSave::~BackgroundSave() {
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<int64_t> BackgroundSave::Wait() {
  if (thread_.joinable()) thread_.join();
  return written_;
}

}  // namespace rlhfd::roles
