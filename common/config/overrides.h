// Hydra-style overrides of a config document, as verl's run scripts pass them on the command
// line and as `rlhfctl submit FILE key=value ...` takes them:
//   key.path=value     set (intermediate mappings are made as needed)
//   +key.path=value    the same (Hydra's "add"; configs here are sparse, so it cannot clash)
//   ++key.path=value   the same (Hydra's "add or override")
//   ~key.path          remove the key
// Values are read as YAML: 4, 1e-6, true, null, text, "quoted text", [a, b], {k: v}.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace rlhfd::config {

// Applies `overrides` in order to `document` (a mapping). INVALID_ARGUMENT names the override and
// what is wrong with it (no '=', an empty key, a value that is not YAML, a key below a value).
absl::Status ApplyOverrides(const std::vector<std::string>& overrides, nlohmann::json* document);

}  // namespace rlhfd::config
