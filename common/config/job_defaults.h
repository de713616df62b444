// The defaults of JobSpec, as one JSON document merged under every config before parsing, so a
// value the user wrote (even 0 or false) is never replaced. Derived defaults (dp, role GPUs)
// are filled by CompleteJobSpec in job_validator.h.
#pragma once

#include <nlohmann/json.hpp>

namespace rlhfd::config {

// The defaults document; every key mirrors a JobSpec field and the default in its proto comment.
const nlohmann::json& JobSpecDefaults();

// Fills every key of the defaults that `config` lacks. Optional sections (roles.critic,
// roles.reference) receive their defaults only when the config has them.
void MergeJobSpecDefaults(nlohmann::json* config);

}  // namespace rlhfd::config
