// The defaults of JobSpec, as one JSON document merged under every config before parsing, so a
// value the user wrote (even 0 or false) is never replaced. Derived defaults (dp, role GPUs)
// are filled by CompleteJobSpec in job_validator.h.
#pragma once

#include <map>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

namespace rlhfd::config {

// The defaults document; every key mirrors a JobSpec field and the default in its proto comment.
const nlohmann::json& JobSpecDefaults();

// Dotted key path → how its default relates to verl's, for keys whose default differs from
// verl's or that verl leaves without one.
const std::map<std::string, std::string>& VerlDefaultNotes();

// Fills every key of the defaults that `config` lacks, adding each filled key's dotted path to
// `filled` when given. Optional sections (roles.critic, roles.reference) receive their defaults
// only when the config has them.
void MergeJobSpecDefaults(nlohmann::json* config, std::set<std::string>* filled = nullptr);

}  // namespace rlhfd::config
