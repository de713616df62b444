// Whole-file reads and crash-safe writes: a reader never sees a half-written file.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rlhfd {

// Reads a whole file; NOT_FOUND / PERMISSION_DENIED name the path. Files over `max_bytes` are
// refused, so a wrong path (a device, a huge log) cannot exhaust memory.
absl::StatusOr<std::string> ReadFileToString(const std::string& path, size_t max_bytes = 64 << 20);

// At most the first `max_bytes` of a file (for peeking at large files: a data file's first line).
absl::StatusOr<std::string> ReadFilePrefix(const std::string& path, size_t max_bytes);

// Reads a whole file in pieces of at most `piece_bytes`, handing each to `consume` in order (for
// checksums of files too large to hold in memory); returns the bytes read.
absl::StatusOr<int64_t> ReadFileInPieces(const std::string& path, size_t piece_bytes,
                                         const std::function<void(absl::string_view)>& consume);

// Each line of a file (without its '\n'), numbered from 1, in order. A line longer than
// `max_line_bytes` is INVALID_ARGUMENT naming the path and line, refused before more of it is
// held; a read error (EIO) or a directory is an error naming the path, never an early end. A
// status `visit` returns that is not OK stops the read and is returned.
absl::Status ReadFileLines(const std::string& path, size_t max_line_bytes,
                           const std::function<absl::Status(int64_t, absl::string_view)>& visit);

// Writes `contents` to `path` atomically: a temporary file in the same directory, fsync, rename,
// fsync of the directory. `mode` is applied to the new file before data is written. A full disk
// or quota (ENOSPC, EDQUOT) here and in the other writers is RESOURCE_EXHAUSTED naming the path;
// the temporary file is removed.
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents,
                                 int mode = 0644);

// WriteFileAtomically with the contents written by `write` to the temporary file's descriptor
// (a download streamed to disk); its failure removes the temporary file and is returned.
absl::Status WriteFileAtomicallyWith(const std::string& path,
                                     const std::function<absl::Status(int fd)>& write,
                                     int mode = 0644);

// Creates `path` and its parents if missing.
absl::Status MakeDirectories(const std::string& path, int mode = 0755);

// Creates `path` (and parents) if missing and makes it 0700: state directories hold tokens and
// job files. An existing directory with wider permissions is tightened.
absl::Status MakePrivateDirectory(const std::string& path);

// Removes the temporary files WriteFileAtomically leaves in `dir` when a process dies between
// creating and renaming one (".<name>.tmp.XXXXXX"); returns how many it removed.
int RemoveStaleTemporaries(const std::string& dir);

// These use POSIX calls, not std::filesystem: LibTorch's shared libraries export their own
// std::filesystem symbols, which interpose on ours and crash in processes that link both.
// `path` absolute, without a ".." component, with "." components, repeated and trailing slashes
// removed ("/a//b/./c/" -> "/a/b/c"); empty for a relative path or one that climbs with "..".
// Lexical only: for comparing a path a request names with the one a config gave.
std::string CleanAbsolutePath(const std::string& path);
bool PathExists(const std::string& path);
bool IsDirectory(const std::string& path);
// Names of the entries of a directory (no "." or ".."), sorted.
absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& path);
// Removes a file or a directory tree; a missing path is not an error.
absl::Status RemoveTree(const std::string& path);

}  // namespace rlhfd
