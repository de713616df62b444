// ConfigErrors: collects every problem found in one config, each naming the file and key path,
// so a user fixes them all in one pass instead of one per submission.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace rlhfd::config {

class ConfigErrors {
 public:
  static constexpr size_t kMaxErrors = 50;

  explicit ConfigErrors(std::string source) : source_(std::move(source)) {}

  // `key_path` is dotted ("roles.actor.train.lr"); empty for the document as a whole.
  void Add(absl::string_view key_path, absl::string_view message) {
    if (Suppressed(key_path, message)) return;
    paths_.emplace_back(key_path);
    // A hostile document can hold thousands of errors; the first ones are enough to act on.
    if (errors_.size() >= kMaxErrors) {
      ++dropped_;
      return;
    }
    errors_.push_back(key_path.empty() ? absl::StrCat(source_, ": ", message)
                                       : absl::StrCat(source_, ": ", key_path, ": ", message));
  }

  // A problem whose message names the file already (a syntax error, a file that cannot be read).
  void AddNamed(absl::string_view message) {
    paths_.emplace_back();
    if (errors_.size() >= kMaxErrors) {
      ++dropped_;
      return;
    }
    errors_.emplace_back(message);
  }

  // Problems found later that follow from `earlier`'s (a value already refused, replaced by
  // its default, would otherwise be reported again as an inconsistency) are left out: those at
  // an earlier key or below it, and those whose message names one.
  void SuppressConsequencesOf(const ConfigErrors& earlier) {
    for (const std::string& path : earlier.paths_) {
      if (!path.empty()) suppressed_keys_.push_back(path);
    }
  }

  // Appends `other`'s problems after this one's.
  void Append(const ConfigErrors& other) {
    for (size_t i = 0; i < other.errors_.size(); ++i) {
      if (errors_.size() >= kMaxErrors) {
        ++dropped_;
        continue;
      }
      errors_.push_back(other.errors_[i]);
      paths_.push_back(other.paths_[i]);
    }
    dropped_ += other.dropped_;
  }

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
  bool Suppressed(absl::string_view key_path, absl::string_view message) const {
    for (const std::string& key : suppressed_keys_) {
      if (key_path == key || absl::StartsWith(key_path, key + ".") ||
          absl::StrContains(message, key)) {
        return true;
      }
    }
    return false;
  }

  std::string source_;
  std::vector<std::string> errors_;
  std::vector<std::string> paths_;
  size_t dropped_ = 0;
  std::vector<std::string> suppressed_keys_;
};

}  // namespace rlhfd::config
