#include "worker/roles/checkpoint.h"

#include <ATen/ATen.h>

#include <optional>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"
#include "worker/model/safetensors_writer.h"
#include "worker/model/state_dict.h"
#include "worker/train/finite_check.h"

namespace rlhfd::roles {
namespace {

constexpr char kStateFile[] = "state.safetensors";
constexpr char kManifestFile[] = "manifest.json";
constexpr int kManifestVersion = 1;

}  // namespace

std::string StepDirectory(const std::string& dir, int64_t step) {
  return absl::StrCat(dir, "/step_", step);
}

std::string RankDirectory(const std::string& dir, int64_t step, const std::string& role,
                          int rank) {
  return absl::StrCat(StepDirectory(dir, step), "/", role, "/rank_", rank);
}

absl::StatusOr<int64_t> SaveRoleState(const std::string& dir, int64_t step,
                                      const std::string& role, int rank,
                                      const train::TrainedModel::NamedTensors& state,
                                      const nlohmann::json& extra) {
  const std::string where = RankDirectory(dir, step, role, rank);
  // Never a checkpoint that holds NaN or infinities (a resume from it can only diverge): checked
  // before anything is written, so `latest` keeps naming the last good one.
  std::vector<at::Tensor> values;
  for (const auto& [name, tensor] : state) values.push_back(tensor);
  if (const std::optional<size_t> bad = train::FirstNonFinite(values)) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": ", state[*bad].first, " holds non-finite values (NaN or infinity); step ", step,
        " is not saved and `latest` still names the last good checkpoint"));
  }
  RETURN_IF_ERROR(MakeDirectories(where));
  // A save of the same step before this one may have been cut short: its manifest goes first.
  const std::string manifest_path = absl::StrCat(where, "/", kManifestFile);
  if (PathExists(manifest_path)) RETURN_IF_ERROR(RemoveTree(manifest_path));
  RETURN_IF_ERROR(model::WriteSafetensors(absl::StrCat(where, "/", kStateFile), state));
  int64_t bytes = 0;
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& [name, tensor] : state) {
    bytes += tensor.numel() * tensor.element_size();
    tensors.push_back(name);
  }
  const nlohmann::json manifest = {{"version", kManifestVersion}, {"step", step},
                                   {"role", role},                {"rank", rank},
                                   {"bytes", bytes},              {"tensors", tensors},
                                   {"extra", extra}};
  RETURN_IF_ERROR(WriteFileAtomically(manifest_path, manifest.dump(1)));
  return bytes;
}

absl::Status CommitLatest(const std::string& dir, int64_t step) {
  if (!IsDirectory(StepDirectory(dir, step))) {
    return absl::FailedPreconditionError(
        absl::StrCat("commit: ", StepDirectory(dir, step), " was not saved"));
  }
  return WriteFileAtomically(absl::StrCat(dir, "/latest"), absl::StrCat("step_", step, "\n"));
}

absl::StatusOr<int64_t> ResolveStep(const std::string& dir, int64_t step) {
  if (step > 0) return step;
  const std::string path = absl::StrCat(dir, "/latest");
  if (!PathExists(path)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir, " (no latest)"));
  }
  ASSIGN_OR_RETURN(std::string text, ReadFilePrefix(path, 64));
  absl::string_view name = absl::StripAsciiWhitespace(text);
  int64_t latest = 0;
  if (!absl::ConsumePrefix(&name, "step_") || !absl::SimpleAtoi(name, &latest) || latest < 1) {
    return absl::DataLossError(absl::StrCat(path, " does not name a step: '", text, "'"));
  }
  return latest;
}

absl::StatusOr<nlohmann::json> LoadRoleState(const std::string& dir, int64_t step,
                                             const std::string& role, int rank,
                                             const train::TrainedModel::NamedTensors& state) {
  const std::string where = RankDirectory(dir, step, role, rank);
  const std::string manifest_path = absl::StrCat(where, "/", kManifestFile);
  if (!PathExists(manifest_path)) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, " has no ", kManifestFile, ": the save of step ", step, " did not finish"));
  }
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(manifest_path, 1 << 20));
  const nlohmann::json manifest = nlohmann::json::parse(text, nullptr, false);
  if (!manifest.is_object() || manifest.value("version", 0) != kManifestVersion ||
      manifest.value("step", int64_t{-1}) != step) {
    return absl::DataLossError(absl::StrCat(manifest_path, " is not a manifest of step ", step));
  }
  ASSIGN_OR_RETURN(const model::StateDict saved,
                   model::StateDict::Load(absl::StrCat(where, "/", kStateFile)));
  if (saved.size() != state.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " holds ", saved.size(), " tensors and this rank's state has ", state.size(),
        ": the checkpoint was saved with another model or layout"));
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, tensor] : state) {
    absl::StatusOr<at::Tensor> value = saved.Get(name);
    if (!value.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": no tensor ", name,
                                                     " (saved with another model or layout)"));
    }
    if (value->sizes() != tensor.sizes() || value->scalar_type() != tensor.scalar_type()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", name, " is ", model::ShapeString(value->sizes()), " ",
          c10::toString(value->scalar_type()), ", this rank's is ",
          model::ShapeString(tensor.sizes()), " ", c10::toString(tensor.scalar_type())));
    }
  }
  for (const auto& [name, tensor] : state) {
    at::Tensor target = tensor;
    target.copy_(*saved.Get(name));
  }
  return manifest.value("extra", nlohmann::json::object());
}

}  // namespace rlhfd::roles
