// DrainStore: the set of drained worker ids, kept in <state_dir>/drained_workers (one id per
// line, replaced atomically), so a drain outlasts worker and controller restarts until lifted.
#pragma once

#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rlhfd::controller {

class DrainStore {
 public:
  static absl::StatusOr<DrainStore> Open(const std::string& state_dir);

  // The ids drained when the store was opened (an unreadable file is logged and read as empty).
  const std::set<std::string>& drained() const { return drained_; }

  // Replaces the stored set.
  absl::Status Save(const std::set<std::string>& drained);

 private:
  DrainStore(std::string path, std::set<std::string> drained)
      : path_(std::move(path)), drained_(std::move(drained)) {}

  std::string path_;
  std::set<std::string> drained_;
};

}  // namespace rlhfd::controller
