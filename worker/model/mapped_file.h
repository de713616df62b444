// MappedFile: a read-only memory map of a whole file, unmapped on destruction.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rlhfd::model {

class MappedFile {
 public:
  static absl::StatusOr<std::shared_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  absl::string_view bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const char* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const char* data_;
  size_t size_;
};

}  // namespace rlhfd::model
