// A verl run's config as verl's Hydra composes it, before convert-verl maps it: the trainer's own
// defaults (verl_defaults.h), the run's file over them, then its overrides; which keys the run
// sets (differ from verl's default); every `${...}` resolved as OmegaConf resolves it.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/config/verl_defaults.h"
#include "nlohmann/json.hpp"

namespace rlhfd::config {

struct ComposedVerlRun {
  nlohmann::json document;                        // composed and resolved
  std::map<std::string, nlohmann::json> flat;     // its leaves by dotted key
  std::set<std::string> user_set;                 // keys whose value differs from verl's default
  std::set<std::string> written;  // keys the run's file or overrides give, whatever their value
  std::map<std::string, std::string> unresolved;  // keys whose interpolation failed, with why
  std::set<std::string> verl_keys;                // every key of verl's default config
};

// INVALID_ARGUMENT naming `source` when the text or an override cannot be read. May throw on
// documents nlohmann cannot represent (ConvertVerlConfig catches).
absl::StatusOr<ComposedVerlRun> ComposeVerlRun(VerlTrainer trainer, absl::string_view text,
                                               absl::string_view source,
                                               const std::vector<std::string>& overrides);

}  // namespace rlhfd::config
