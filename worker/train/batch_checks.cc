// Batch checks; see batch_checks.h.
#include "worker/train/batch_checks.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/model/transformer.h"

namespace rlhfd::train {
namespace {

std::string Shape(const at::Tensor& t) {
  return t.defined() ? absl::StrCat("(", absl::StrJoin(t.sizes(), ", "), ")") : "undefined";
}

}  // namespace

BatchChecker::BatchChecker(absl::string_view what, const at::Tensor& input_ids,
                           int64_t vocab_size)
    : what_(what) {
  if (!input_ids.defined() || input_ids.dim() != 2 || input_ids.scalar_type() != at::kLong ||
      input_ids.size(1) < 2) {
    Fail("input_ids", absl::StrCat("must be (B, T) int64 with T >= 2, got ", Shape(input_ids)));
    return;
  }
  rows_ = input_ids.size(0);
  columns_ = input_ids.size(1);
  if (absl::Status ids = model::CheckTokenIds(input_ids, vocab_size, absl::StrCat(what, ": input_ids"));
      !ids.ok()) {
    status_ = ids;
  }
}

void BatchChecker::Fail(absl::string_view name, absl::string_view problem) {
  if (status_.ok()) {
    status_ = absl::InvalidArgumentError(absl::StrCat(what_, ": ", name, " ", problem));
  }
}

void BatchChecker::Mask(absl::string_view name, const at::Tensor& mask) {
  if (!status_.ok() || !mask.defined()) return;
  if (mask.dim() != 2 || mask.size(0) != rows_ || mask.size(1) != columns_) {
    Fail(name, absl::StrCat("must be (", rows_, ", ", columns_, ") like input_ids, got ",
                            Shape(mask)));
  }
}

void BatchChecker::PerToken(absl::string_view name, const at::Tensor& tensor, bool required) {
  if (!status_.ok() || (!required && !tensor.defined())) return;
  if (!tensor.defined() || tensor.dim() != 2 || tensor.size(0) != rows_ ||
      tensor.size(1) != columns_ - 1) {
    Fail(name, absl::StrCat("must be (", rows_, ", ", columns_ - 1, "), one value per predicted "
                            "token, got ", Shape(tensor)));
  }
}

}  // namespace rlhfd::train
