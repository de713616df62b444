// Whole-file reads and crash-safe writes: a reader never sees a half-written file.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rlhfd {

// Reads a whole file; NOT_FOUND / PERMISSION_DENIED name the path. Files over `max_bytes` are
// refused, so a wrong path (a device, a huge log) cannot exhaust memory.
absl::StatusOr<std::string> ReadFileToString(const std::string& path,
                                             size_t max_bytes = 64 << 20);

// Writes `contents` to `path` atomically: a temporary file in the same directory, fsync, rename,
// fsync of the directory. `mode` is applied to the new file before data is written.
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents,
                                 int mode = 0644);

// Creates `path` and its parents if missing.
absl::Status MakeDirectories(const std::string& path, int mode = 0755);

}  // namespace rlhfd
