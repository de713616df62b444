// Drained worker ids on disk; see drain_store.h.
#include "controller/store/drain_store.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/logging/logging.h"
#include "common/util/files.h"

namespace rlhfd::controller {

absl::StatusOr<DrainStore> DrainStore::Open(const std::string& state_dir) {
  const std::string path = state_dir + "/drained_workers";
  std::set<std::string> drained;
  auto text = ReadFileToString(path, 1 << 20);
  if (text.ok()) {
    for (absl::string_view line : absl::StrSplit(*text, '\n', absl::SkipWhitespace())) {
      drained.emplace(absl::StripAsciiWhitespace(line));
    }
  } else if (!absl::IsNotFound(text.status())) {
    RLOG(ERROR) << "drained workers: " << text.status().message()
               << "; starting with no worker drained";
  }
  return DrainStore(path, std::move(drained));
}

absl::Status DrainStore::Save(const std::set<std::string>& drained) {
  std::string text = absl::StrJoin(drained, "\n");
  if (!text.empty()) text += "\n";
  if (absl::Status written = WriteFileAtomically(path_, text, 0600); !written.ok()) return written;
  drained_ = drained;
  return absl::OkStatus();
}

}  // namespace rlhfd::controller
