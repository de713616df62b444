// ConfigErrors: collects every problem found in one config, each naming the file and key path,
// so a user fixes them all in one pass instead of one per submission.
#pragma once

#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rlhfd::config {

class ConfigErrors {
 public:
  explicit ConfigErrors(std::string source) : source_(std::move(source)) {}

  // `key_path` is dotted ("roles.actor.train.lr"); empty for the document as a whole.
  void Add(absl::string_view key_path, absl::string_view message) {
    // A hostile document can hold thousands of errors; the first ones are enough to act on.
    if (errors_.size() >= kMaxErrors) {
      ++dropped_;
      return;
    }
    errors_.push_back(key_path.empty() ? absl::StrCat(source_, ": ", message)
                                       : absl::StrCat(source_, ": ", key_path, ": ", message));
  }
  static constexpr size_t kMaxErrors = 50;

  bool empty() const { return errors_.empty(); }
  const std::vector<std::string>& errors() const { return errors_; }
  const std::string& source() const { return source_; }

  // INVALID_ARGUMENT listing every error, one per line; OK when there are none.
  absl::Status ToStatus() const {
    if (errors_.empty()) return absl::OkStatus();
    if (errors_.size() == 1) return absl::InvalidArgumentError(errors_.front());
    std::string text = absl::StrCat(errors_.size() + dropped_, " problems in ", source_, ":\n  ",
                                    absl::StrJoin(errors_, "\n  "));
    if (dropped_ > 0) absl::StrAppend(&text, "\n  ... and ", dropped_, " more");
    return absl::InvalidArgumentError(text);
  }

 private:
  std::string source_;
  std::vector<std::string> errors_;
  size_t dropped_ = 0;
};

}  // namespace rlhfd::config
