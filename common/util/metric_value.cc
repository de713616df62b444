// Metric values in JSON and text; see metric_value.h.
#include "common/util/metric_value.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"

namespace rlhfd {

std::optional<absl::string_view> NonFiniteName(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  return std::nullopt;
}

std::string FormatMetric(double value, int digits) {
  if (const auto name = NonFiniteName(value)) return std::string(*name);
  return absl::StrFormat("%.*g", digits, value);
}

nlohmann::json MetricToJson(double value) {
  if (const auto name = NonFiniteName(value)) return std::string(*name);
  return value;
}

std::optional<double> MetricFromJson(const nlohmann::json& value) {
  if (value.is_number()) return value.get<double>();
  if (value.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (!value.is_string()) return std::nullopt;
  const std::string& text = value.get_ref<const std::string&>();
  if (text == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (text == "Infinity") return std::numeric_limits<double>::infinity();
  if (text == "-Infinity") return -std::numeric_limits<double>::infinity();
  return std::nullopt;
}

}  // namespace rlhfd
