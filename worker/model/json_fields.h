// Reading the JSON files of a model directory (config.json, generation_config.json,
// tokenizer.json, tokenizer_config.json) without exceptions: a parse bounded in depth, and typed
// reads of optional keys whose errors name the file and the key. A model directory is user
// input; none of its contents may throw out of a function that returns a Status.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rlhfd::model {

// Parses `text`; nested deeper than `max_depth` is an error, as is anything but valid JSON.
absl::StatusOr<nlohmann::json> ParseModelJson(absl::string_view text, absl::string_view source,
                                              int max_depth = 64);

// Typed reads of `object[key]`: a missing key or null gives `fallback`; a value of another type,
// or outside [low, high], is INVALID_ARGUMENT naming `source` and `key`.
class JsonFields {
 public:
  JsonFields(const nlohmann::json& object, absl::string_view source)
      : object_(object), source_(source) {}

  absl::Status Bool(const char* key, bool fallback, bool* out) const;
  absl::Status String(const char* key, const std::string& fallback, std::string* out) const;
  absl::Status Int(const char* key, int64_t fallback, int64_t low, int64_t high,
                   int64_t* out) const;
  absl::Status Number(const char* key, double fallback, double low, double high,
                      double* out) const;
  // Whether the key is present and not null.
  bool Has(const char* key) const;

 private:
  absl::Status Wrong(const char* key, absl::string_view expected) const;

  const nlohmann::json& object_;
  absl::string_view source_;
};

}  // namespace rlhfd::model
