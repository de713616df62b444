// Skips in [gpu] test binaries: a test that cannot run its scenario here (two ranks on one GPU,
// references that were not made) says so, and the binary then exits 77, which CTest reports as
// skipped rather than passed.
#pragma once

#include <string>

namespace rlhfd::testing {

// Records why the calling test did not run; it should return right after.
void ReportSkipped(const std::string& reason);

}  // namespace rlhfd::testing
