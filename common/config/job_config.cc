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

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpec(absl::string_view text, absl::string_view source) {
  ASSIGN_OR_RETURN(nlohmann::json document, ParseConfigDocument(text, source));
  return SpecFromDocument(document, source);
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
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  auto printed = google::protobuf::util::MessageToJsonString(spec, &json, options);
  if (!printed.ok()) return absl::InternalError(printed.ToString());
  return SpecFromDocument(nlohmann::json::parse(json), source);
}

}  // namespace rlhfd::config
