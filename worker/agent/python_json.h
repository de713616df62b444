// JSON text as Python's json.dumps(x, ensure_ascii=False) writes it, which is what a Hugging Face
// chat template's `tojson` prints (the tool schemas in a Qwen prompt): ", " and ": " between
// items, non-ASCII kept as it is.
#pragma once

#include <string>

#include "nlohmann/json.hpp"

namespace rlhfd::agent {

// Keys come in the order verl's pydantic schema models dump them (type, function, name,
// description, parameters, properties, required, enum, items, strict), then the rest
// alphabetically: nlohmann::json keeps no insertion order, so the names under `properties`
// come alphabetically rather than as the tool config lists them.
std::string PythonJsonDumps(const nlohmann::json& value);

}  // namespace rlhfd::agent
