#include "common/util/program_setup.h"

#include "absl/synchronization/mutex.h"

namespace rlhfd {

void SetUpProgram() { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); }

}  // namespace rlhfd
