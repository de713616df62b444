// How a verl conversion's notes read on a terminal; see verl_import.h.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/verl_import.h"

namespace rlhfd::config {

std::string FormatVerlNotes(const VerlConversion& conversion) {
  // (refused first, why) -> keys, in the order they were found.
  std::map<std::pair<bool, std::string>, std::vector<std::string>> groups;
  for (const VerlNote& note : conversion.notes)
    groups[{!note.refused, note.why}].push_back(note.key);
  std::string out;
  for (const auto& [group, keys] : groups) {
    absl::StrAppend(&out, group.first ? "warning: ignored (" : "error: not supported (",
                    group.second, "): ", absl::StrJoin(keys, ", "), "\n");
  }
  return out;
}

}  // namespace rlhfd::config
