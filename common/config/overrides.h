// Hydra-style overrides of a config document, as verl's run scripts pass them on the command
// line and as `rlhfctl submit FILE key=value ...` takes them:
//   key.path=value     set (intermediate mappings are made as needed)
//   +key.path=value    the same (Hydra's "add"; configs here are sparse, so it cannot clash)
//   ++key.path=value   the same (Hydra's "add or override")
//   ~key.path          remove the key
// Values are read as YAML: 4, 1e-6, true, null, text, "quoted text", [a, b], {k: v}.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/config/config_errors.h"

namespace rlhfd::config {

// Applies `overrides` in order to `document` (a mapping). INVALID_ARGUMENT names the override and
// what is wrong with it (no '=', an empty key, a value that is not YAML, a key below a value).
absl::Status ApplyOverrides(const std::vector<std::string>& overrides, nlohmann::json* document);

// The same, applying every override it can: each it cannot is added to `errors`, so that one
// bad override does not hide the config's other problems. False (nothing applied) only for more
// overrides than are accepted.
bool ApplyOverrides(const std::vector<std::string>& overrides, nlohmann::json* document,
                    ConfigErrors* errors);

}  // namespace rlhfd::config
