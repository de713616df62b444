// YAML (yaml-cpp) and JSON (nlohmann) front ends of the config loader.
#include "absl/strings/string_view.h"
#include "common/config/config_document.h"

#include <yaml-cpp/yaml.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace rlhfd::config {
namespace {

// Deep YAML documents are refused rather than recursed into without bound.
constexpr int kMaxDepth = 32;

absl::StatusOr<nlohmann::json> YamlToJson(const YAML::Node& node, absl::string_view source,
                                          int depth) {
  if (depth > kMaxDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": nested deeper than ", kMaxDepth, " levels"));
  }
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return nlohmann::json(nullptr);
    case YAML::NodeType::Scalar: {
      // Plain "~" / "null" are YAML nulls; quoted ones are strings.
      if (node.Tag() == "?" && (node.Scalar() == "~" || node.Scalar() == "null")) {
        return nlohmann::json(nullptr);
      }
      return nlohmann::json(node.Scalar());
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json array = nlohmann::json::array();
      for (const YAML::Node& item : node) {
        auto value = YamlToJson(item, source, depth + 1);
        if (!value.ok()) return value.status();
        array.push_back(*std::move(value));
      }
      return array;
    }
    case YAML::NodeType::Map: {
      nlohmann::json object = nlohmann::json::object();
      for (const auto& entry : node) {
        if (!entry.first.IsScalar()) {
          return absl::InvalidArgumentError(absl::StrCat(
              source, ": line ", entry.first.Mark().line + 1, ": keys must be plain names"));
        }
        const std::string key = entry.first.Scalar();
        if (object.contains(key)) {
          return absl::InvalidArgumentError(absl::StrCat(source, ": line ",
                                                         entry.first.Mark().line + 1,
                                                         ": key '", key, "' appears twice"));
        }
        auto value = YamlToJson(entry.second, source, depth + 1);
        if (!value.ok()) return value.status();
        object[key] = *std::move(value);
      }
      return object;
    }
  }
  return absl::InternalError("unknown YAML node type");
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseConfigDocument(absl::string_view text, absl::string_view source) {
  nlohmann::json document;
  if (absl::EndsWith(source, ".json")) {
    try {
      document = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& error) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": invalid JSON at byte ", error.byte, ": ", error.what()));
    }
  } else {
    YAML::Node root;
    try {
      root = YAML::Load(std::string(text));
    } catch (const YAML::Exception& error) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": invalid YAML at line ",
                                                     error.mark.line + 1, ", column ",
                                                     error.mark.column + 1, ": ", error.msg));
    }
    auto converted = YamlToJson(root, source, 0);
    if (!converted.ok()) return converted.status();
    document = *std::move(converted);
  }
  if (!document.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the top level must be a mapping of keys (name:, model:, ...)"));
  }
  return document;
}

}  // namespace rlhfd::config
