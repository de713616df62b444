// Parses a config file's text (YAML or JSON) into a JSON document. YAML plain scalars stay
// strings: the schema walker (proto_json_schema.h) gives them their type from the field they
// fill, so `name: 2024` is a name and `lr: 1e-6` a number.
//
// Config text comes from users and from the network, so parsing is bounded: the text's size,
// the nesting depth, and the number of values and scalar bytes after YAML aliases are expanded
// (an alias "bomb" of a kilobyte can otherwise stand for billions of values). Every key and
// string must be valid UTF-8, and a key may appear once per mapping, in JSON as in YAML.
#pragma once

#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rlhfd::config {

struct DocumentLimits {
  size_t max_text_bytes = 1 << 20;
  int max_depth = 32;
  // Values (mappings, lists and scalars) in the expanded document.
  int64_t max_values = 100'000;
  // Bytes of all keys and scalars in the expanded document.
  int64_t max_scalar_bytes = 4 << 20;
};

// `source` names the file in errors; a ".json" suffix selects the strict JSON parser, anything
// else YAML (which also reads JSON). The top level must be a mapping. Never throws.
absl::StatusOr<nlohmann::json> ParseConfigDocument(absl::string_view text,
                                                   absl::string_view source,
                                                   const DocumentLimits& limits = {});

// The same, keys in the file's order (a tool config's schemas, which a chat template prints in
// it).
absl::StatusOr<nlohmann::ordered_json> ParseOrderedConfigDocument(
    absl::string_view text, absl::string_view source, const DocumentLimits& limits = {});

// One JSON value (a data file's line, say) parsed within `limits`: the same bounds, strict JSON
// whatever `source` is called, any top-level value, keys in the text's order (a chat template
// prints a tool call's arguments in it). Never throws.
absl::StatusOr<nlohmann::ordered_json> ParseBoundedJson(absl::string_view text,
                                                        absl::string_view source,
                                                        const DocumentLimits& limits);

}  // namespace rlhfd::config
