// A role's name where people read it: logs, metric names, error messages, checkpoint
// directories and the controller's placement records ("actor", "critic", "reference", "reward",
// "rollout").
#pragma once

#include "rlhfd/v1/worker_service.pb.h"

namespace rlhfd::stages {

// const char*: absl::StrCat and string concatenation take it as is.
inline const char* RoleName(v1::Role role) {
  switch (role) {
    case v1::ROLE_ACTOR:
      return "actor";
    case v1::ROLE_CRITIC:
      return "critic";
    case v1::ROLE_REFERENCE:
      return "reference";
    case v1::ROLE_REWARD:
      return "reward";
    case v1::ROLE_ROLLOUT:
      return "rollout";
    default:
      return "unspecified role";
  }
}

}  // namespace rlhfd::stages
