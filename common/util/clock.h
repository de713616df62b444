// Wall-clock time in the unit the API reports (milliseconds since the Unix epoch).
#pragma once

#include <cstdint>

#include "absl/time/clock.h"

namespace rlhfd {

inline int64_t NowUnixMillis() { return absl::ToUnixMillis(absl::Now()); }

}  // namespace rlhfd
