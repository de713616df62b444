// See hydra_compose.h.
#include "common/config/hydra_compose.h"

#include <cmath>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace rlhfd::config::hydra {

using Json = nlohmann::json;

// YAML plain scalars arrive as text (rlhfd's schema types them later); verl's keys are read
// here before that, so "True", "512" and "1e-6" become what YAML (and Hydra) would make them.
std::optional<Json> TypedScalar(const std::string& text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "true") return Json(true);
  if (lower == "false") return Json(false);
  int64_t integer;
  if (absl::SimpleAtoi(text, &integer)) return Json(integer);
  double number;
  if (absl::SimpleAtod(text, &number) && std::isfinite(number) &&
      text.find_first_of("0123456789") != std::string::npos) {
    return Json(number);
  }
  return std::nullopt;
}

Json Typed(const Json& value) {
  if (value.is_array()) {
    Json out = Json::array();
    for (const Json& item : value) out.push_back(Typed(item));
    return out;
  }
  if (!value.is_string()) return value;
  std::optional<Json> typed = TypedScalar(value.get_ref<const std::string&>());
  return typed.has_value() ? *std::move(typed) : value;
}

void TypeAll(Json* node) {
  if (node->is_object()) {
    for (auto& [key, child] : node->items()) TypeAll(&child);
  } else {
    *node = Typed(*node);
  }
}

void MergeInto(Json* base, const Json& over) {
  for (const auto& [key, value] : over.items()) {
    Json& slot = (*base)[key];
    if (value.is_object() && slot.is_object()) {
      MergeInto(&slot, value);
    } else {
      slot = value;
    }
  }
}

void Flatten(const Json& node, const std::string& path, std::map<std::string, Json>* out) {
  if (node.is_object() && !node.empty()) {
    for (const auto& [key, value] : node.items()) {
      Flatten(value, path.empty() ? key : path + "." + key, out);
    }
  } else if (!path.empty()) {
    (*out)[path] = Typed(node);
  }
}

void Set(Json* config, const std::string& path, Json value) {
  Json* node = config;
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    Json& child = (*node)[parts[i]];
    if (!child.is_object()) child = Json::object();
    node = &child;
  }
  (*node)[parts.back()] = std::move(value);
}

}  // namespace rlhfd::config::hydra
