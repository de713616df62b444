// SmallFilesystem over mount(2)/umount2(2).
#include "tests/support/small_filesystem.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/util/files.h"

namespace rlhfd::testing {

std::unique_ptr<SmallFilesystem> SmallFilesystem::Mount(const std::string& path, int64_t bytes,
                                                        std::string* why) {
  if (const absl::Status made = MakeDirectories(path); !made.ok()) {
    *why = std::string(made.message());
    return nullptr;
  }
  const std::string options = absl::StrCat("size=", bytes, ",mode=0755");
  if (::mount("tmpfs", path.c_str(), "tmpfs", 0, options.c_str()) != 0) {
    *why =
        absl::StrCat("cannot mount a tmpfs on ", path, ": ", std::strerror(errno), " (needs root)");
    return nullptr;
  }
  return std::unique_ptr<SmallFilesystem>(new SmallFilesystem(path));
}

SmallFilesystem::~SmallFilesystem() { ::umount2(path_.c_str(), MNT_DETACH); }

int64_t SmallFilesystem::Fill() {
  const std::string ballast = path_ + "/ballast";
  const int fd = ::open(ballast.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return 0;
  const std::string chunk(4096, 'b');
  int64_t written = 0;
  while (true) {
    const ssize_t n = ::write(fd, chunk.data(), chunk.size());
    if (n <= 0 && errno != EINTR) break;
    if (n > 0) written += n;
  }
  ::close(fd);
  return written;
}

void SmallFilesystem::Free() { ::unlink((path_ + "/ballast").c_str()); }

}  // namespace rlhfd::testing
