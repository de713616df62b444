#include "worker/roles/step_batch.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status/status_macros.h"
#include "common/util/text.h"

namespace rlhfd::roles {
namespace {

std::string Shape(const std::vector<int64_t>& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

}  // namespace

absl::StatusOr<TensorInfo> CheckStepTensor(std::string_view name) {
  if (const TensorInfo* found = stages::FindStepTensor(name); found != nullptr) return *found;
  std::vector<std::string> names;
  for (const TensorInfo& info : stages::kStepTensors) names.emplace_back(info.name);
  return absl::InvalidArgumentError(absl::StrCat(
      "tensors: '", SanitizeForDisplay(absl::string_view(name.data(), name.size()), 40),
      "' is not a step tensor (", absl::StrJoin(names, ", "), ")"));
}

void StepBatch::Begin(int64_t step, int64_t total_rows, RowRange rows, int64_t prompt_length,
                      int64_t response_length) {
  step_ = step;
  total_rows_ = total_rows;
  rows_ = rows;
  prompt_length_ = prompt_length;
  response_length_ = response_length;
  tensors_.clear();
  sources_.clear();
}

std::vector<int64_t> StepBatch::RowShape(const TensorInfo& info) const {
  switch (info.kind) {
    case TensorKind::kTokens:
      return {prompt_length_ + response_length_};
    case TensorKind::kPerToken:
      return {response_length_};
    case TensorKind::kPerRow:
    default:
      return {};
  }
}

at::ScalarType StepBatch::DtypeOf(const TensorInfo& info) {
  return info.kind == TensorKind::kTokens ? at::kLong : at::kFloat;
}

absl::Status StepBatch::Put(std::string_view name, at::Tensor tensor) {
  absl::StatusOr<TensorInfo> info = CheckStepTensor(name);
  if (!info.ok()) return info.status();
  std::vector<int64_t> expected = {rows_.size()};
  for (int64_t d : RowShape(*info)) expected.push_back(d);
  if (!tensor.defined() || tensor.sizes().vec() != expected ||
      tensor.scalar_type() != DtypeOf(*info)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", step_, ": ", std::string(name), " must be ", Shape(expected), " ",
        c10::toString(DtypeOf(*info)), " for this rank's ", rows_.size(), " rows, not ",
        tensor.defined() ? absl::StrCat(Shape(tensor.sizes().vec()), " ",
                                        c10::toString(tensor.scalar_type()))
                         : "nothing"));
  }
  tensors_[std::string(name)] = std::move(tensor);
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> StepBatch::Get(std::string_view name, std::string_view needed_by) const {
  const auto found = tensors_.find(std::string(name));
  if (found == tensors_.end()) {
    const TensorInfo* info = stages::FindStepTensor(name);
    return absl::FailedPreconditionError(absl::StrCat(
        std::string(needed_by), " needs ", std::string(name), " of step ", step_,
        ", which this rank does not hold: call ",
        info != nullptr ? std::string(info->made_by) : std::string("the stage that makes it"),
        " (and move it here) first"));
  }
  return found->second;
}

absl::StatusOr<at::Tensor> StepBatch::ResponseLengths(std::string_view needed_by) const {
  ASSIGN_OR_RETURN(const at::Tensor mask, Get(stages::tensors::kAttentionMask, needed_by));
  return mask.narrow(1, prompt_length_, response_length_).sum(1).to(at::kLong);
}

}  // namespace rlhfd::roles
