// Exception-free JSON reading for model files; see json_fields.h.
#include "worker/model/json_fields.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/util/text.h"

namespace rlhfd::model {
namespace {

// Thrown from the parser callback to stop a parse that is too deep (nlohmann's callbacks can
// only discard, not stop); caught right below.
struct TooDeep {};

}  // namespace

absl::StatusOr<nlohmann::json> ParseModelJson(absl::string_view text, absl::string_view source,
                                              int max_depth) {
  try {
    return nlohmann::json::parse(
        text.begin(), text.end(),
        [max_depth](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
          if (depth > max_depth) throw TooDeep{};
          return true;
        });
  } catch (const TooDeep&) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": nested deeper than ", max_depth, " levels"));
  } catch (const std::exception& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not valid JSON (", SanitizeForDisplay(error.what(), 200), ")"));
  }
}

bool JsonFields::Has(const char* key) const {
  return object_.is_object() && object_.contains(key) && !object_[key].is_null();
}

absl::Status JsonFields::Wrong(const char* key, absl::string_view expected) const {
  return absl::InvalidArgumentError(absl::StrCat(
      source_, ": '", key, "' must be ", expected, ", not ",
      SanitizeForDisplay(
          object_[key].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), 40)));
}

absl::Status JsonFields::Bool(const char* key, bool fallback, bool* out) const {
  *out = fallback;
  if (!Has(key)) return absl::OkStatus();
  if (!object_[key].is_boolean()) return Wrong(key, "true or false");
  *out = object_[key].get<bool>();
  return absl::OkStatus();
}

absl::Status JsonFields::String(const char* key, const std::string& fallback,
                                std::string* out) const {
  *out = fallback;
  if (!Has(key)) return absl::OkStatus();
  if (!object_[key].is_string()) return Wrong(key, "a string");
  *out = object_[key].get<std::string>();
  return absl::OkStatus();
}

absl::Status JsonFields::Int(const char* key, int64_t fallback, int64_t low, int64_t high,
                             int64_t* out) const {
  *out = fallback;
  if (!Has(key)) return absl::OkStatus();
  const nlohmann::json& value = object_[key];
  const std::string range = absl::StrCat("a whole number in [", low, ", ", high, "]");
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() > static_cast<uint64_t>(high)) return Wrong(key, range);
  } else if (!value.is_number_integer()) {
    return Wrong(key, range);
  }
  const int64_t number = value.get<int64_t>();
  if (number < low || number > high) return Wrong(key, range);
  *out = number;
  return absl::OkStatus();
}

absl::Status JsonFields::Number(const char* key, double fallback, double low, double high,
                                double* out) const {
  *out = fallback;
  if (!Has(key)) return absl::OkStatus();
  const nlohmann::json& value = object_[key];
  const std::string range = absl::StrCat("a number in [", low, ", ", high, "]");
  if (!value.is_number()) return Wrong(key, range);
  const double number = value.get<double>();
  if (!std::isfinite(number) || number < low || number > high) return Wrong(key, range);
  *out = number;
  return absl::OkStatus();
}

}  // namespace rlhfd::model
