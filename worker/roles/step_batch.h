// The step's per-row tensors one rank holds, by name, in verl's layout: rows × (P + R) token
// tensors (prompt left-padded to P, response right-padded to R), rows × R per-token tensors
// aligned with the responses, and per-row values. Every tensor a stage reads or writes is
// registered here with its shape and dtype, so a move or a stage can check what it is given.
#pragma once

#include <ATen/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/stages/step_tensors.h"
#include "common/util/row_split.h"

namespace rlhfd::roles {

// A row of the step-tensor table (common/stages/step_tensors.h), which says every tensor's name,
// row shape and maker.
using TensorInfo = stages::StepTensor;
using stages::TensorKind;

// The row of `name`; INVALID_ARGUMENT, listing the step's tensors, for a name that has none.
absl::StatusOr<TensorInfo> CheckStepTensor(std::string_view name);

// What a response row was generated from (kept on the actor ranks for rewards and logs).
struct RowSource {
  std::string ground_truth_json;
  std::string data_source;
  std::string prompt_text;      // as the model saw it (the chat template applied)
  std::string extra_info_json;  // the row's extra_info object; "" when it has none
};

class StepBatch {
 public:
  // Starts `step` with this rank's rows [rows.begin, rows.end) of `total_rows`, P and R; drops
  // what an earlier step held.
  void Begin(int64_t step, int64_t total_rows, RowRange rows, int64_t prompt_length,
             int64_t response_length);
  bool begun() const { return step_ > 0; }
  int64_t step() const { return step_; }
  int64_t total_rows() const { return total_rows_; }
  RowRange rows() const { return rows_; }
  int64_t prompt_length() const { return prompt_length_; }
  int64_t response_length() const { return response_length_; }

  // INVALID_ARGUMENT when `tensor` does not have the registered shape for this rank's rows.
  absl::Status Put(std::string_view name, at::Tensor tensor);
  bool Has(std::string_view name) const { return tensors_.count(std::string(name)) > 0; }
  // FAILED_PRECONDITION naming the stage that needs it and the one that makes it.
  absl::StatusOr<at::Tensor> Get(std::string_view name, std::string_view needed_by) const;
  // The shape of one row of `name`, and its dtype.
  std::vector<int64_t> RowShape(const TensorInfo& info) const;
  static at::ScalarType DtypeOf(const TensorInfo& info);
  const std::map<std::string, at::Tensor>& tensors() const { return tensors_; }
  // Each row's response length in tokens (long, on the batch's device): its attention mask over
  // the response, so the tool responses a multi-turn rollout inserted count, which
  // response_mask's sum (the sampled tokens alone) leaves out.
  absl::StatusOr<at::Tensor> ResponseLengths(std::string_view needed_by) const;

  std::vector<RowSource>& sources() { return sources_; }
  const std::vector<RowSource>& sources() const { return sources_; }

 private:
  int64_t step_ = 0;
  int64_t total_rows_ = 0;
  RowRange rows_;
  int64_t prompt_length_ = 0, response_length_ = 0;
  std::map<std::string, at::Tensor> tensors_;
  std::vector<RowSource> sources_;
};

}  // namespace rlhfd::roles
