// Checks a config document against a protobuf message's schema and normalises it into the JSON
// that protobuf's parser accepts: unknown keys (with a did-you-mean), wrong types, integer
// ranges and enum names are reported with their dotted key path.
#pragma once

#include <string>
#include <string_view>

#include <google/protobuf/descriptor.h>
#include <nlohmann/json.hpp>

#include "common/config/config_errors.h"

namespace rlhfd::config {

// Returns the normalised document; problems go to `errors` (the result is then unusable).
// Enums are written in configs by their short lower-case name ("grpo" for
// ADVANTAGE_ESTIMATOR_GRPO; '-' and '_' interchangeable).
nlohmann::json NormalizeToSchema(const nlohmann::json& document,
                                 const google::protobuf::Descriptor& schema, ConfigErrors* errors);

// The config name of an enum value: ADVANTAGE_ESTIMATOR_GRPO → "grpo".
std::string EnumConfigName(const google::protobuf::EnumValueDescriptor& value);

}  // namespace rlhfd::config
