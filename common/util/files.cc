// POSIX implementation of the file helpers.
#include "common/util/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/status/status_macros.h"

namespace rlhfd {
namespace {

absl::Status ErrnoStatus(int err, absl::string_view what, const std::string& path) {
  std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

// Closes the descriptor on every path out.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(other.Release()) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  int Release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// `path` opened for reading; an error naming it when it cannot be, or is a directory.
absl::StatusOr<FileDescriptor> OpenForReading(const std::string& path) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "cannot stat", path);
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is a directory, not a file"));
  }
  return fd;
}

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path, size_t max_bytes) {
  ASSIGN_OR_RETURN(FileDescriptor fd, OpenForReading(path));
  std::string contents;
  char buffer[1 << 16];
  while (true) {
    ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot read", path);
    }
    if (n == 0) break;
    if (contents.size() + n > max_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat(path, " is larger than ", max_bytes, " bytes; is this the right file?"));
    }
    contents.append(buffer, n);
  }
  return contents;
}

absl::StatusOr<std::string> ReadFilePrefix(const std::string& path, size_t max_bytes) {
  ASSIGN_OR_RETURN(FileDescriptor fd, OpenForReading(path));
  std::string contents(max_bytes, '\0');
  size_t filled = 0;
  while (filled < max_bytes) {
    ssize_t n = ::read(fd.get(), contents.data() + filled, max_bytes - filled);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot read", path);
    }
    if (n == 0) break;
    filled += static_cast<size_t>(n);
  }
  contents.resize(filled);
  return contents;
}

absl::StatusOr<int64_t> ReadFileInPieces(const std::string& path, size_t piece_bytes,
                                         const std::function<void(absl::string_view)>& consume) {
  ASSIGN_OR_RETURN(FileDescriptor fd, OpenForReading(path));
  std::string piece(std::max<size_t>(piece_bytes, 1), '\0');
  int64_t total = 0;
  while (true) {
    ssize_t n = ::read(fd.get(), piece.data(), piece.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot read", path);
    }
    if (n == 0) break;
    consume(absl::string_view(piece.data(), static_cast<size_t>(n)));
    total += n;
  }
  return total;
}

absl::Status ReadFileLines(const std::string& path, size_t max_line_bytes,
                           const std::function<absl::Status(int64_t, absl::string_view)>& visit) {
  ASSIGN_OR_RETURN(FileDescriptor fd, OpenForReading(path));
  std::string line;  // the part of a line that an earlier read ended in
  int64_t number = 1;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd.get(), buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "cannot read", path);
    }
    if (n == 0) break;
    absl::string_view piece(buffer, static_cast<size_t>(n));
    while (!piece.empty()) {
      const size_t newline = piece.find('\n');
      const absl::string_view part = piece.substr(0, newline);
      if (line.size() + part.size() > max_line_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ":", number, ": the line is longer than ", max_line_bytes, " bytes"));
      }
      if (newline == absl::string_view::npos) {
        line.append(part.data(), part.size());
        break;
      }
      if (line.empty()) {
        RETURN_IF_ERROR(visit(number, part));
      } else {
        line.append(part.data(), part.size());
        RETURN_IF_ERROR(visit(number, line));
        line.clear();
      }
      ++number;
      piece.remove_prefix(newline + 1);
    }
  }
  if (!line.empty()) RETURN_IF_ERROR(visit(number, line));
  return absl::OkStatus();
}

absl::Status WriteFileAtomicallyWith(const std::string& path,
                                     const std::function<absl::Status(int fd)>& write, int mode) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  std::string tmp = absl::StrCat(dir, "/.", base, ".tmp.XXXXXX");
  FileDescriptor fd(::mkstemp(tmp.data()));
  if (fd.get() < 0) return ErrnoStatus(errno, "cannot create a temporary file in", dir);
  auto fail = [&](int err, absl::string_view what) {
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, what, tmp);
  };
  if (::fchmod(fd.get(), mode) != 0) return fail(errno, "cannot chmod");
  if (absl::Status written = write(fd.get()); !written.ok()) {
    ::unlink(tmp.c_str());
    return written;
  }
  if (::fsync(fd.get()) != 0) return fail(errno, "cannot fsync");
  if (::close(fd.Release()) != 0) return fail(errno, "cannot close");
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return fail(errno, "cannot rename onto " + path + " from");
  FileDescriptor dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() >= 0) ::fsync(dir_fd.get());
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents, int mode) {
  return WriteFileAtomicallyWith(
      path,
      [&](int fd) {
        size_t offset = 0;
        while (offset < contents.size()) {
          const ssize_t n = ::write(fd, contents.data() + offset, contents.size() - offset);
          if (n < 0) {
            if (errno == EINTR) continue;
            return ErrnoStatus(errno, "cannot write", path);
          }
          offset += n;
        }
        return absl::OkStatus();
      },
      mode);
}

absl::Status MakeDirectories(const std::string& path, int mode) {
  for (size_t end = path.find('/', 1);; end = path.find('/', end + 1)) {
    const std::string prefix = path.substr(0, end);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), mode) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, "cannot create directory", prefix);
    }
    if (end == std::string::npos) break;
  }
  if (!IsDirectory(path)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a directory"));
  }
  return absl::OkStatus();
}

absl::Status MakePrivateDirectory(const std::string& path) {
  if (absl::Status made = MakeDirectories(path, 0700); !made.ok()) return made;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, "cannot stat", path);
  if ((st.st_mode & 0077) != 0 && ::chmod(path.c_str(), 0700) != 0) {
    return ErrnoStatus(errno, "cannot make private (chmod 0700)", path);
  }
  return absl::OkStatus();
}

int RemoveStaleTemporaries(const std::string& dir) {
  auto names = ListDirectory(dir);
  if (!names.ok()) return 0;
  int removed = 0;
  for (const std::string& name : *names) {
    if (name.size() > 1 && name[0] == '.' && name.find(".tmp.") != std::string::npos &&
        ::unlink((dir + "/" + name).c_str()) == 0) {
      ++removed;
    }
  }
  return removed;
}

std::string CleanAbsolutePath(const std::string& path) {
  if (path.empty() || path[0] != '/') return "";
  std::string clean;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (part == ".") continue;
    if (part == "..") return "";
    absl::StrAppend(&clean, "/", part);
  }
  return clean.empty() ? "/" : clean;
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& path) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return ErrnoStatus(errno, "cannot list", path);
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? absl::OkStatus() : ErrnoStatus(errno, "cannot stat", path);
  }
  if (S_ISDIR(st.st_mode)) {
    auto names = ListDirectory(path);
    if (!names.ok()) return names.status();
    for (const std::string& name : *names) {
      if (absl::Status removed = RemoveTree(path + "/" + name); !removed.ok()) return removed;
    }
    if (::rmdir(path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, "cannot remove", path);
    }
  } else if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    // ENOENT: another process removed it first (ranks clearing a shared step), which is the goal.
    return ErrnoStatus(errno, "cannot remove", path);
  }
  return absl::OkStatus();
}

}  // namespace rlhfd
