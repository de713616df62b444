// The config pipeline; see job_config.h.
#include "common/config/job_config.h"

#include <google/protobuf/util/json_util.h>

#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/config/config_document.h"
#include "common/config/config_errors.h"
#include "common/config/job_defaults.h"
#include "common/config/job_validator.h"
#include "common/config/overrides.h"
#include "common/config/proto_json_schema.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"
#include "common/util/text.h"

namespace rlhfd::config {
namespace {

// rlhfd configs hold values: a Hydra/OmegaConf `${...}` left in one (copied from a verl config)
// would otherwise pass as text (a name, a path) and mean something else than it says.
void RefuseInterpolations(const nlohmann::json& node, const std::string& path,
                          ConfigErrors* errors) {
  if (node.is_object()) {
    for (const auto& [key, value] : node.items()) {
      RefuseInterpolations(value, path.empty() ? key : absl::StrCat(path, ".", key), errors);
    }
  } else if (node.is_array()) {
    for (size_t i = 0; i < node.size(); ++i) {
      RefuseInterpolations(node[i], absl::StrCat(path, "[", i, "]"), errors);
    }
  } else if (node.is_string() && absl::StrContains(node.get_ref<const std::string&>(), "${")) {
    errors->Add(path, absl::StrCat("'", SanitizeForDisplay(node.get<std::string>(), 120),
                                   "' is an interpolation; rlhfd configs take values (`rlhfctl "
                                   "convert-verl` resolves a verl config's)"));
  }
}

// The spec of `document` with every problem added to `errors`; nullopt only when no spec can be
// made of it at all. The checks run even after schema errors, so one pass reports everything;
// what follows from a value already refused (its default stood in) is left out.
std::optional<LoadedConfig> SpecFromDocument(const nlohmann::json& document,
                                             absl::string_view source, ConfigErrors* errors) {
  ConfigErrors schema_errors{std::string(source)};
  RefuseInterpolations(document, "", &schema_errors);
  nlohmann::json normalized =
      NormalizeToSchema(document, *v1::JobSpec::descriptor(), &schema_errors);
  LoadedConfig loaded;
  MergeJobSpecDefaults(&normalized, &loaded.defaulted);

  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto parsed =
      google::protobuf::util::JsonStringToMessage(normalized.dump(), &loaded.spec, options);
  if (!parsed.ok()) {
    errors->Append(schema_errors);
    // The schema walk should have caught everything the parser refuses.
    if (schema_errors.empty()) {
      errors->AddNamed(absl::StrCat(source,
                                    ": config passed the schema check but not protobuf's parser (",
                                    parsed.ToString(), "); please report this"));
    }
    return std::nullopt;
  }
  ConfigErrors checks{std::string(source)};
  checks.SuppressConsequencesOf(schema_errors);
  CompleteAndValidateJobSpec(&loaded.spec, &checks, &loaded.derived);
  errors->Append(schema_errors);
  errors->Append(checks);
  return loaded;
}

// The loader's boundary: whatever a library throws on hostile input becomes a Status here, so no
// exception reaches the caller's thread (the controller's event loop, an RPC thread).
template <typename Result, typename Body>
absl::StatusOr<Result> Guarded(absl::string_view source, Body body) {
  try {
    return body();
  } catch (const std::exception& error) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": the config could not be processed (", SanitizeForDisplay(error.what(), 200),
        "); please report this with the file"));
  }
}

}  // namespace

std::optional<LoadedConfig> LoadConfigCollectingErrors(absl::string_view text,
                                                       absl::string_view source,
                                                       const std::vector<std::string>& overrides,
                                                       ConfigErrors* errors) {
  absl::StatusOr<std::optional<LoadedConfig>> loaded = Guarded<std::optional<LoadedConfig>>(
      source, [&]() -> absl::StatusOr<std::optional<LoadedConfig>> {
        nlohmann::json document = nlohmann::json::object();
        if (!text.empty()) {
          ASSIGN_OR_RETURN(document, ParseConfigDocument(text, source));
        }
        if (!ApplyOverrides(overrides, &document, errors)) {
          return std::optional<LoadedConfig>();
        }
        return SpecFromDocument(document, source, errors);
      });
  if (!loaded.ok()) {
    // Text that does not parse leaves nothing to check.
    errors->AddNamed(loaded.status().message());
    return std::nullopt;
  }
  return *std::move(loaded);
}

absl::StatusOr<LoadedConfig> LoadConfig(absl::string_view text, absl::string_view source,
                                        const std::vector<std::string>& overrides) {
  ConfigErrors errors{std::string(source)};
  std::optional<LoadedConfig> loaded = LoadConfigCollectingErrors(text, source, overrides, &errors);
  RETURN_IF_ERROR(errors.ToStatus());
  if (!loaded) return absl::InternalError(absl::StrCat(source, ": no spec and no error"));
  return *std::move(loaded);
}

absl::StatusOr<v1::JobSpec> ParseJobSpec(absl::string_view text, absl::string_view source,
                                         const std::vector<std::string>& overrides) {
  ASSIGN_OR_RETURN(LoadedConfig loaded, LoadConfig(text, source, overrides));
  return std::move(loaded.spec);
}

absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path) {
  auto text = ReadFileToString(path, /*max_bytes=*/1 << 20);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("cannot read job config: ", text.status().message()));
  }
  return ParseJobSpec(*text, path);
}

absl::StatusOr<v1::JobSpec> CompleteJobSpec(const v1::JobSpec& spec, absl::string_view source) {
  return Guarded<v1::JobSpec>(source, [&]() -> absl::StatusOr<v1::JobSpec> {
    std::string json;
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    auto printed = google::protobuf::util::MessageToJsonString(spec, &json, options);
    if (!printed.ok()) {
      // Protobuf refuses to print strings that are not UTF-8.
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": the spec cannot be read (", printed.ToString(), "); strings must be UTF-8"));
    }
    ASSIGN_OR_RETURN(nlohmann::json document,
                     ParseConfigDocument(json, absl::StrCat(source, ".json")));
    ConfigErrors errors{std::string(source)};
    std::optional<LoadedConfig> loaded = SpecFromDocument(document, source, &errors);
    RETURN_IF_ERROR(errors.ToStatus());
    if (!loaded) return absl::InternalError(absl::StrCat(source, ": no spec and no error"));
    return std::move(loaded->spec);
  });
}

}  // namespace rlhfd::config
