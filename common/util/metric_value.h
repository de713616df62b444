// How a metric value is written where the format has no NaN or infinity. JSON has neither, so
// every JSON place a metric goes (metrics.jsonl, the metric history, REST, rlhfctl --json) spells
// them as protobuf's JSON mapping spells a double: the strings "NaN", "Infinity" and "-Infinity".
// Text for people (the console logger, rlhfctl tables) uses the same words. A training run that
// went non-finite then shows it everywhere instead of a blank or a dropped key.
#pragma once

#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace rlhfd {

// "NaN", "Infinity" or "-Infinity" for a value that is not finite; none for a finite one.
std::optional<absl::string_view> NonFiniteName(double value);

// `value` as text: its non-finite name, or printf's %.<digits>g.
std::string FormatMetric(double value, int digits = 6);

// `value` as a JSON number, or its non-finite name as a string.
nlohmann::json MetricToJson(double value);

// The inverse of MetricToJson: a number, or one of the three names. `null` reads as NaN: writers
// before the names existed wrote every non-finite value as null. Anything else: none.
std::optional<double> MetricFromJson(const nlohmann::json& value);

}  // namespace rlhfd
