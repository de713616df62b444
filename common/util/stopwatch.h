// Elapsed time on the monotonic clock, in seconds: what step timings, stage timings and the
// benchmarks report. The one helper for it (std::chrono spelled out each time was a twin).
#pragma once

#include <chrono>

#include "absl/time/time.h"

namespace rlhfd {

using SteadyTime = std::chrono::steady_clock::time_point;

// Seconds from `start` to now.
inline double SecondsSince(SteadyTime start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Started when made: Seconds() is the time since.
class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double Seconds() const { return SecondsSince(start_); }
  absl::Duration Elapsed() const {
    return absl::FromChrono(std::chrono::steady_clock::now() - start_);
  }
  SteadyTime start() const { return start_; }

 private:
  SteadyTime start_;
};

}  // namespace rlhfd
