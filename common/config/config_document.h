// Parses a config file's text (YAML or JSON) into a JSON document. YAML plain scalars stay
// strings: the schema walker (proto_json_schema.h) gives them their type from the field they
// fill, so `name: 2024` is a name and `lr: 1e-6` a number.
#pragma once

#include <string>
#include "absl/strings/string_view.h"

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace rlhfd::config {

// `source` names the file in errors; a ".json" suffix selects the strict JSON parser, anything
// else YAML (which also reads JSON). The top level must be a mapping.
absl::StatusOr<nlohmann::json> ParseConfigDocument(absl::string_view text, absl::string_view source);

}  // namespace rlhfd::config
