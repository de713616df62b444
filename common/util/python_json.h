// JSON text as Python's json.dumps(value, ensure_ascii=False) writes it, which is what a Hugging
// Face chat template's `tojson` prints (a tool call's arguments, a tool schema): ", " and ": "
// between items, keys in the order the value holds them, non-ASCII kept as it is, floats as
// Python's repr (2000000000000000.0, 1e-05, NaN). A string that is not UTF-8 has its bad bytes
// replaced (U+FFFD) rather than throwing. An integer beyond 64 bits, which the JSON reader holds
// as a double, prints as that double.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace rlhfd {

std::string PythonJsonDumps(const nlohmann::ordered_json& value);

}  // namespace rlhfd
