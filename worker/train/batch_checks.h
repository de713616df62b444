// Shape and id checks of a training batch at the update's entry: batches come from other
// processes, and a wrong shape must be a Status naming the tensor, not a LibTorch exception
// deep in a forward.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace rlhfd::train {

// input_ids (B, T) int64 within the vocabulary, attention_mask undefined or (B, T), and each
// per-token tensor (B, T-1). `what` names the update in errors.
class BatchChecker {
 public:
  BatchChecker(absl::string_view what, const at::Tensor& input_ids, int64_t vocab_size);

  void Mask(absl::string_view name, const at::Tensor& mask);
  // A (B, T-1) tensor; `required` false lets it be undefined.
  void PerToken(absl::string_view name, const at::Tensor& tensor, bool required = true);
  absl::Status status() const { return status_; }

 private:
  void Fail(absl::string_view name, absl::string_view problem);

  std::string what_;
  int64_t rows_ = 0, columns_ = 0;
  absl::Status status_;
};

}  // namespace rlhfd::train
