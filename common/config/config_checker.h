// What the JobSpec checks share: the limits on any config and the Checker that records an
// error per key path with what to change (job_validator.cc and the section checks beside it).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/config/config_errors.h"

namespace rlhfd::config {

// Upper bounds far past any real job, so that arithmetic on counts cannot overflow and a typo of
// three extra zeros is caught here rather than as an allocation failure on a worker.
constexpr int kMaxGpus = 65536;
constexpr int kMaxBatch = 1 << 24;
constexpr int kMaxTokens = 1 << 30;
constexpr int kMaxSamplesPerPrompt = 1024;
constexpr int kMaxVocabulary = 1 << 24;
constexpr double kMaxSteps = 1e9;

// Whole numbers as integers (1000000, not 1e+06), others as StrCat prints them.
inline std::string Number(double value) {
  if (std::floor(value) == value && std::fabs(value) < 1e15) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  return absl::StrCat(value);
}

class Checker {
 public:
  explicit Checker(ConfigErrors* errors) : errors_(errors) {}

  void AtLeast(const std::string& path, double value, double low) {
    if (value < low) errors_->Add(path, absl::StrCat(Number(value), " must be >= ", Number(low)));
  }
  void Above(const std::string& path, double value, double low) {
    if (!(value > low)) {
      errors_->Add(path, absl::StrCat(Number(value), " must be > ", Number(low)));
    }
  }
  void Within(const std::string& path, double value, double low, double high) {
    if (!(value >= low && value <= high)) {
      errors_->Add(
          path, absl::StrCat(Number(value), " must be in [", Number(low), ", ", Number(high), "]"));
    }
  }
  void OpenInterval(const std::string& path, double value, double low, double high) {
    if (!(value > low && value < high)) {
      errors_->Add(
          path, absl::StrCat(Number(value), " must be in (", Number(low), ", ", Number(high), ")"));
    }
  }
  void Fail(const std::string& path, const std::string& message) { errors_->Add(path, message); }

 private:
  ConfigErrors* errors_;
};

}  // namespace rlhfd::config
