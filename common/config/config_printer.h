// Printing configs back to people: a JobSpec as the config document a user would write (enum
// config names, numbers as numbers), and any such document as YAML with a comment per key —
// what `rlhfctl validate` and `rlhfctl convert-verl` print.
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "rlhfd/v1/job_spec.pb.h"

namespace rlhfd::config {

// Every field of `spec`, absent optional sections left out, enums by their config names.
nlohmann::json SpecToDocument(const v1::JobSpec& spec);

// Block-style YAML of a config document, its keys in the schema's order (JobSpec's fields);
// `comment(path)` (dotted key path) may return a note printed after that key's value
// ("# ..."). Lists of scalars print inline, strings are quoted when YAML would read them as
// something else.
std::string ToYaml(const nlohmann::json& document,
                   const std::function<std::string(const std::string& path)>& comment = {});

}  // namespace rlhfd::config
