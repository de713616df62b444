#include "worker/agent/tool_config.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/config_document.h"
#include "common/util/python_json.h"

namespace rlhfd::agent {
namespace {

// verl's class names and rlhfd's own, to the tool that runs.
const std::pair<const char*, ToolSpec::Kind> kClasses[] = {
    {"verl.tools.sandbox_fusion_tools.SandboxFusionTool", ToolSpec::Kind::kCodeInterpreter},
    {"code_interpreter", ToolSpec::Kind::kCodeInterpreter},
    {"calculator", ToolSpec::Kind::kCalculator},
    {"http", ToolSpec::Kind::kHttp},
};

// A positive number from a config value (YAML scalars arrive as strings).
// A number above 0 and at most `most` (a day of seconds, a TiB of megabytes: past them a limit
// is none, and a cast of 1e300 to an integer undefined).
absl::StatusOr<double> PositiveNumber(const nlohmann::json& value, const std::string& where,
                                      double most) {
  double number = 0;
  const bool read = value.is_number()   ? (number = value.get<double>(), true)
                    : value.is_string() ? absl::SimpleAtod(value.get<std::string>(), &number)
                                        : false;
  if (!read || !(number > 0) || !(number <= most)) {
    return absl::InvalidArgumentError(absl::StrCat(where, " must be a positive number up to ",
                                                   static_cast<int64_t>(most), " (got ",
                                                   value.dump(), ")"));
  }
  return number;
}

constexpr double kMostSeconds = 86400, kMostMegabytes = 1 << 20;

}  // namespace

absl::StatusOr<std::vector<ToolSpec>> ReadToolConfig(absl::string_view text,
                                                     absl::string_view source) {
  absl::StatusOr<nlohmann::json> document = config::ParseConfigDocument(text, source);
  if (!document.ok()) return document.status();
  // Again with the keys in the file's order, for the schemas the prompt prints.
  absl::StatusOr<nlohmann::ordered_json> ordered = config::ParseOrderedConfigDocument(text, source);
  if (!ordered.ok()) return ordered.status();
  const auto tools = document->find("tools");
  if (tools == document->end() || !tools->is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": a tool config is a mapping with a `tools` list"));
  }
  std::vector<ToolSpec> specs;
  std::set<std::string> names;
  for (size_t i = 0; i < tools->size(); ++i) {
    const nlohmann::json& tool = (*tools)[i];
    const std::string where = absl::StrCat(source, ": tools[", i, "]");
    if (!tool.is_object()) return absl::InvalidArgumentError(where + " is not a mapping");
    const auto class_entry = tool.find("class_name");
    if (class_entry == tool.end() || !class_entry->is_string()) {
      return absl::InvalidArgumentError(
          where + ".class_name must be the text naming the tool's class (e.g. calculator)");
    }
    const std::string class_name = class_entry->get<std::string>();
    const auto known = std::find_if(std::begin(kClasses), std::end(kClasses),
                                    [&](const auto& entry) { return class_name == entry.first; });
    if (known == std::end(kClasses)) {
      std::vector<std::string> accepted;
      for (const auto& [name, kind] : kClasses) accepted.push_back(name);
      return absl::InvalidArgumentError(absl::StrCat(where, ".class_name '", class_name,
                                                     "' is not a tool rlhfd runs (",
                                                     absl::StrJoin(accepted, ", "), ")"));
    }
    ToolSpec spec{.kind = known->second};
    spec.schema = tool.value("tool_schema", nlohmann::json::object());
    const nlohmann::json* function = spec.schema.is_object() && spec.schema.contains("function")
                                         ? &spec.schema["function"]
                                         : nullptr;
    if (function == nullptr || !function->is_object() || !function->contains("name") ||
        !(*function)["name"].is_string() || (*function)["name"].get<std::string>().empty()) {
      return absl::InvalidArgumentError(
          where + ".tool_schema.function.name is missing: it names the tool for the model");
    }
    spec.name = (*function)["name"].get<std::string>();
    spec.prompt_schema = PromptToolSchemaText(
        (*ordered)["tools"][i].value("tool_schema", nlohmann::ordered_json::object()));
    if (!names.insert(spec.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": a second tool named '", spec.name, "'"));
    }
    const nlohmann::json config = tool.value("config", nlohmann::json::object());
    if (!config.is_object()) return absl::InvalidArgumentError(where + ".config is not a mapping");
    if (spec.kind == ToolSpec::Kind::kCodeInterpreter) {
      for (const auto& [key, value] : config.items()) {
        const std::string at = absl::StrCat(where, ".config.", key);
        if (key == "default_timeout") {
          absl::StatusOr<double> seconds = PositiveNumber(value, at, kMostSeconds);
          if (!seconds.ok()) return seconds.status();
          spec.limits.wall_time = absl::Seconds(*seconds);
          spec.limits.cpu_seconds = static_cast<int64_t>(std::ceil(*seconds));
        } else if (key == "memory_limit_mb") {
          absl::StatusOr<double> megabytes = PositiveNumber(value, at, kMostMegabytes);
          if (!megabytes.ok()) return megabytes.status();
          spec.limits.memory_mb = static_cast<int64_t>(*megabytes);
        } else if (key == "default_language") {
          if (value != "python") {
            return absl::InvalidArgumentError(
                absl::StrCat(at, " is ", value.dump(), ": the code interpreter runs python"));
          }
        } else {
          // sandbox_fusion_url, num_workers, rate limits, type: the remote service's settings.
          spec.ignored.push_back(key);
        }
      }
    } else if (spec.kind == ToolSpec::Kind::kHttp) {
      for (const auto& [key, value] : config.items()) {
        const std::string at = absl::StrCat(where, ".config.", key);
        if (key == "url") {
          const std::string url = value.is_string() ? value.get<std::string>() : "";
          if (!absl::StartsWith(url, "http://") && !absl::StartsWith(url, "https://")) {
            return absl::InvalidArgumentError(
                absl::StrCat(at, " is ", value.dump(), ": an http:// or https:// URL"));
          }
          spec.url = url;
        } else if (key == "timeout") {
          absl::StatusOr<double> seconds = PositiveNumber(value, at, kMostSeconds);
          if (!seconds.ok()) return seconds.status();
          spec.timeout = absl::Seconds(*seconds);
        } else {
          spec.ignored.push_back(key);
        }
      }
      if (spec.url.empty()) {
        return absl::InvalidArgumentError(where + ".config.url is missing: the service to call");
      }
    } else {
      for (const auto& [key, value] : config.items()) spec.ignored.push_back(key);
    }
    specs.push_back(std::move(spec));
  }
  return specs;
}

namespace {

// `object`'s `keys` that it has, in that order (a pydantic model's fields, as it dumps them).
nlohmann::ordered_json Keep(const nlohmann::ordered_json& object,
                            std::initializer_list<const char*> keys) {
  nlohmann::ordered_json kept = nlohmann::ordered_json::object();
  if (!object.is_object()) return kept;
  for (const char* key : keys) {
    if (object.contains(key)) kept[key] = object.at(key);
  }
  return kept;
}

}  // namespace

nlohmann::ordered_json PromptToolSchema(const nlohmann::ordered_json& schema) {
  nlohmann::ordered_json tool = Keep(schema, {"type", "function"});
  if (!tool.contains("function")) return tool;
  nlohmann::ordered_json& function = tool["function"];
  function = Keep(function, {"name", "description", "parameters", "strict"});
  if (!function.contains("parameters")) return tool;
  nlohmann::ordered_json& parameters = function["parameters"];
  parameters = Keep(parameters, {"type", "properties", "required"});
  if (parameters.contains("properties") && parameters["properties"].is_object()) {
    // The properties are a mapping of names, kept in the file's order.
    for (auto& [name, property] : parameters["properties"].items()) {
      property = Keep(property, {"type", "description", "enum"});
    }
  }
  return tool;
}

std::string PromptToolSchemaText(const nlohmann::ordered_json& schema) {
  return PythonJsonDumps(PromptToolSchema(schema));
}

}  // namespace rlhfd::agent
