// SmallFilesystem: a tmpfs of a few megabytes mounted for a test, so a real ENOSPC can be made
// (Fill) and taken away (Free) without touching any other disk. Mounting needs root
// (CAP_SYS_ADMIN); where it is refused, Mount says why and tests skip that part.
#pragma once

#include <memory>
#include <string>

namespace rlhfd::testing {

class SmallFilesystem {
 public:
  // Mounts a tmpfs of `bytes` on `path` (made if missing); nullptr with `why` when it cannot.
  static std::unique_ptr<SmallFilesystem> Mount(const std::string& path, int64_t bytes,
                                                std::string* why);
  // Unmounts (lazily, so files a process still holds do not keep it mounted).
  ~SmallFilesystem();
  SmallFilesystem(const SmallFilesystem&) = delete;
  SmallFilesystem& operator=(const SmallFilesystem&) = delete;

  const std::string& path() const { return path_; }
  // Writes a ballast file until the filesystem is full (ENOSPC); returns the bytes it took.
  int64_t Fill();
  // Removes the ballast: the space is back.
  void Free();

 private:
  explicit SmallFilesystem(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace rlhfd::testing
