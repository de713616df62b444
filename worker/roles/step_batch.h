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
#include "common/util/row_split.h"

namespace rlhfd::roles {

// The shape of a named tensor's rows.
enum class TensorKind {
  kTokens,    // (rows, P + R), int64: input_ids, attention_mask
  kPerToken,  // (rows, R), float32: response_mask, log-probs, values, rewards, advantages
  kPerRow,    // (rows), float32: scores
};

struct TensorInfo {
  std::string_view name;
  TensorKind kind;
};

// Every tensor of a step: input_ids, attention_mask, response_mask, rollout_log_probs,
// old_log_probs, ref_log_probs, values, scores, token_rewards, advantages, returns.
const std::vector<TensorInfo>& StepTensors();
// INVALID_ARGUMENT for a name that is not one of them.
absl::StatusOr<TensorInfo> FindStepTensor(std::string_view name);

// What a response row was generated from (kept on the actor ranks for rewards and logs).
struct RowSource {
  std::string ground_truth_json;
  std::string data_source;
  std::string prompt_text;  // as the model saw it (the chat template applied)
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
