// rlhfctl submit, validate and convert-verl: reading a config (rlhfd's or verl's) and what is
// sent or shown of it.
#include <unistd.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/config/config_errors.h"
#include "common/config/config_printer.h"
#include "common/config/job_config.h"
#include "common/config/job_defaults.h"
#include "common/config/job_validator.h"
#include "common/config/proto_json_schema.h"
#include "common/config/verl_import.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"
#include "controller/cli/cli_flags.h"
#include "controller/cli/commands.h"
#include "controller/cli/printing.h"
#include "controller/jobs/submit_checks.h"

namespace rlhfd::cli {
namespace {

// A config file's text, or empty for "-" (a verl config given by overrides alone).
absl::StatusOr<std::string> ConfigText(const std::string& path, bool verl) {
  if (verl && path == "-") return std::string();
  auto text = ReadFileToString(path, 1 << 20);
  if (!text.ok()) return absl::Status(text.status().code(), text.status().message());
  return text;
}

// The verl keys not honoured, each once, grouped by why.
void PrintConversionReport(const config::VerlConversion& conversion) {
  std::cerr << config::FormatVerlNotes(conversion);
}

// The rlhfd config text a submission sends: the file as it is, or the conversion of a verl
// config (the verl overrides are consumed by the conversion).
absl::StatusOr<std::string> SubmittedText(const std::string& path, VerlSource verl,
                                          std::vector<std::string>* overrides) {
  ASSIGN_OR_RETURN(std::string text, ConfigText(path, verl.has_value()));
  if (!verl) return text;
  ASSIGN_OR_RETURN(config::VerlConversion conversion,
                   config::ConvertVerlConfig(text, path, *overrides, *verl));
  PrintConversionReport(conversion);
  if (!conversion.errors.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", conversion.errors.size(),
        " verl settings are not supported (above); change them, or convert with `rlhfctl "
        "convert-verl",
        *verl == config::VerlTrainer::kSft ? " --sft" : "", "` and edit the result"));
  }
  overrides->clear();
  return conversion.config.dump();
}

}  // namespace

int Submit(Client& client, const std::string& path, VerlSource verl,
           std::vector<std::string> overrides, std::string* job_id) {
  auto text = SubmittedText(path, verl, &overrides);
  if (!text.ok()) {
    std::cerr << "error: " << text.status().message() << "\n";
    return absl::IsInvalidArgument(text.status()) ? kExitFailed : kExitUsage;
  }
  v1::SubmitJobRequest request;
  request.set_config_text(*text);
  // A converted config is JSON; the name says where it came from.
  request.set_config_name(verl ? absl::StrCat(path == "-" ? "verl" : path, ".json") : path);
  for (const std::string& item : overrides) request.add_overrides(item);
  if (char cwd[4096]; ::getcwd(cwd, sizeof(cwd)) != nullptr) request.set_base_dir(cwd);
  grpc::ClientContext context;
  client.Prepare(&context);
  v1::SubmitJobReply reply;
  if (auto status = client.jobs().SubmitJob(&context, request, &reply); !status.ok()) {
    return Fail(status);
  }
  for (const std::string& warning : reply.warnings()) std::cerr << "warning: " << warning << "\n";
  *job_id = reply.job().job_id();
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << ToJson(reply) << "\n";
  } else {
    std::cout << "submitted " << reply.job().job_id() << " (" << reply.job().spec().name()
              << "): " << ShortEnum(v1::JobState_descriptor(), reply.job().state()) << "\n";
  }
  return kExitOk;
}

int Validate(const std::string& path, VerlSource verl, std::vector<std::string> overrides) {
  auto text = SubmittedText(path, verl, &overrides);
  if (!text.ok()) {
    std::cerr << "error: " << text.status().message() << "\n";
    return absl::IsInvalidArgument(text.status()) ? kExitFailed : kExitUsage;
  }
  const std::string source = verl ? absl::StrCat(path, ".json") : path;
  // The config's problems and those of the files it names on this machine, all at once, as the
  // controller reports them at submission.
  config::ConfigErrors problems(source);
  std::optional<config::LoadedConfig> loaded =
      config::LoadConfigCollectingErrors(*text, source, overrides, &problems);
  if (loaded) {
    char cwd[4096];
    const std::string base_dir = ::getcwd(cwd, sizeof(cwd)) != nullptr ? cwd : "";
    controller::ResolveAndCheckFiles(base_dir, &loaded->spec, &problems);
  }
  if (absl::Status status = problems.ToStatus(); !status.ok()) {
    std::cerr << "error: " << status.message() << "\n";
    return kExitFailed;
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << config::SpecToDocument(loaded->spec).dump(1) << "\n";
    return kExitOk;
  }
  const auto& notes = config::VerlDefaultNotes();
  std::cout << "# " << path << ": valid; " << loaded->defaulted.size() << " values from defaults, "
            << loaded->derived.size() << " derived\n";
  std::cout << config::ToYaml(config::SpecToDocument(loaded->spec), [&](const std::string& key) {
    std::string note;
    if (loaded->defaulted.count(key)) note = "(default)";
    if (loaded->derived.count(key)) note = "(derived)";
    if (!note.empty()) {
      if (auto it = notes.find(key); it != notes.end()) {
        note = absl::StrCat(note.substr(0, note.size() - 1), "; ", it->second, ")");
      }
    }
    return note;
  });
  return kExitOk;
}

int ConvertVerl(const std::string& path, config::VerlTrainer trainer,
                const std::vector<std::string>& overrides) {
  auto text = ConfigText(path, /*verl=*/true);
  if (!text.ok()) {
    std::cerr << "error: " << text.status().message() << "\n";
    return kExitUsage;
  }
  auto conversion = config::ConvertVerlConfig(*text, path, overrides, trainer);
  if (!conversion.ok()) {
    std::cerr << "error: " << conversion.status().message() << "\n";
    return kExitFailed;
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << nlohmann::json{{"config", conversion->config},
                                {"mapped", conversion->mapped},
                                {"warnings", conversion->warnings},
                                {"errors", conversion->errors},
                                {"verl_resolved", conversion->verl_resolved}}
                     .dump(1)
              << "\n";
  } else {
    std::cout << "# converted from " << (path == "-" ? "verl's defaults" : path)
              << "; check it with `rlhfctl validate`\n"
              << config::ToYaml(conversion->config);
    PrintConversionReport(*conversion);
  }
  return conversion->errors.empty() ? kExitOk : kExitFailed;
}

}  // namespace rlhfd::cli
