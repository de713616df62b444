// The config pipeline; see job_config.h.
#include "absl/strings/string_view.h"
#include "common/config/job_config.h"

#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "common/config/config_document.h"
#include "common/config/config_errors.h"
#include "common/config/job_defaults.h"
#include "common/config/job_validator.h"
#include "common/config/proto_json_schema.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"
#include "common/util/text.h"

namespace rlhfd::config {
namespace {

absl::StatusOr<v1::JobSpec> SpecFromDocument(const nlohmann::json& document,
                                             absl::string_view source) {
  ConfigErrors errors{std::string(source)};
  nlohmann::json normalized = NormalizeToSchema(document, *v1::JobSpec::descriptor(), &errors);
  RETURN_IF_ERROR(errors.ToStatus());
  MergeJobSpecDefaults(&normalized);

  v1::JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto parsed = google::protobuf::util::JsonStringToMessage(normalized.dump(), &spec, options);
  if (!parsed.ok()) {
    // The schema walk should have caught everything the parser refuses.
    return absl::InternalError(
        absl::StrCat(source, ": config passed the schema check but not protobuf's parser (",
                     parsed.ToString(), "); please report this"));
  }
  CompleteAndValidateJobSpec(&spec, &errors);
  RETURN_IF_ERROR(errors.ToStatus());
  return spec;
}

// The loader's boundary: whatever a library throws on hostile input becomes a Status here, so no
// exception reaches the caller's thread (the controller's event loop, an RPC thread).
template <typename Body>
absl::StatusOr<v1::JobSpec> Guarded(absl::string_view source, Body body) {
  try {
    return body();
  } catch (const std::exception& error) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": the config could not be processed (", SanitizeForDisplay(error.what(), 200),
        "); please report this with the file"));
  }
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpec(absl::string_view text, absl::string_view source) {
  return Guarded(source, [&]() -> absl::StatusOr<v1::JobSpec> {
    ASSIGN_OR_RETURN(nlohmann::json document, ParseConfigDocument(text, source));
    return SpecFromDocument(document, source);
  });
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
  return Guarded(source, [&]() -> absl::StatusOr<v1::JobSpec> {
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
    return SpecFromDocument(document, source);
  });
}

}  // namespace rlhfd::config
