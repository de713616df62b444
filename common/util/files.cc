// POSIX implementation of the file helpers.
#include "absl/strings/string_view.h"
#include "common/util/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace rlhfd {
namespace {

absl::Status ErrnoStatus(int err, absl::string_view what, const std::string& path) {
  std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  switch (err) {
    case ENOENT: return absl::NotFoundError(message);
    case EACCES:
    case EPERM: return absl::PermissionDeniedError(message);
    case ENOSPC: return absl::ResourceExhaustedError(message);
    default: return absl::InternalError(message);
  }
}

// Closes the descriptor on every path out.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  int Release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path, size_t max_bytes) {
  FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoStatus(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "cannot stat", path);
  if (S_ISDIR(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, " is a directory, not a file"));
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

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents, int mode) {
  const std::filesystem::path target(path);
  const std::string dir = target.has_parent_path() ? target.parent_path().string() : ".";
  std::string tmp = absl::StrCat(dir, "/.", target.filename().string(), ".tmp.XXXXXX");
  FileDescriptor fd(::mkstemp(tmp.data()));
  if (fd.get() < 0) return ErrnoStatus(errno, "cannot create a temporary file in", dir);
  auto fail = [&](int err, absl::string_view what) {
    ::unlink(tmp.c_str());
    return ErrnoStatus(err, what, tmp);
  };
  if (::fchmod(fd.get(), mode) != 0) return fail(errno, "cannot chmod");
  size_t offset = 0;
  while (offset < contents.size()) {
    ssize_t n = ::write(fd.get(), contents.data() + offset, contents.size() - offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail(errno, "cannot write");
    }
    offset += n;
  }
  if (::fsync(fd.get()) != 0) return fail(errno, "cannot fsync");
  if (::close(fd.Release()) != 0) return fail(errno, "cannot close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail(errno, "cannot rename onto " + path + " from");
  FileDescriptor dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd.get() >= 0) ::fsync(dir_fd.get());
  return absl::OkStatus();
}

absl::Status MakeDirectories(const std::string& path, int mode) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot create directory ", path, ": ", error.message()));
  }
  return absl::OkStatus();
}

}  // namespace rlhfd
