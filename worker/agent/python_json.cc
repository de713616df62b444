#include "worker/agent/python_json.h"

#include <algorithm>
#include <array>
#include <string_view>
#include <vector>

namespace rlhfd::agent {
namespace {

constexpr std::array<std::string_view, 10> kSchemaOrder = {
    "type",       "function", "name", "description", "parameters",
    "properties", "required", "enum", "items",       "strict"};

int Rank(const std::string& key) {
  const auto found = std::find(kSchemaOrder.begin(), kSchemaOrder.end(), key);
  return static_cast<int>(found - kSchemaOrder.begin());  // the rest share the last rank
}

void Dump(const nlohmann::json& value, std::string& out) {
  if (value.is_object()) {
    std::vector<std::string> keys;
    for (const auto& item : value.items()) keys.push_back(item.key());
    std::stable_sort(keys.begin(), keys.end(), [](const std::string& a, const std::string& b) {
      return Rank(a) < Rank(b);  // items() are alphabetical already
    });
    out += '{';
    for (size_t i = 0; i < keys.size(); ++i) {
      if (i > 0) out += ", ";
      out += nlohmann::json(keys[i]).dump(-1, ' ', /*ensure_ascii=*/false);
      out += ": ";
      Dump(value.at(keys[i]), out);
    }
    out += '}';
  } else if (value.is_array()) {
    out += '[';
    for (size_t i = 0; i < value.size(); ++i) {
      if (i > 0) out += ", ";
      Dump(value[i], out);
    }
    out += ']';
  } else {
    out += value.dump(-1, ' ', /*ensure_ascii=*/false);
  }
}

}  // namespace

std::string PythonJsonDumps(const nlohmann::json& value) {
  std::string out;
  Dump(value, out);
  return out;
}

}  // namespace rlhfd::agent
