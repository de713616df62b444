#include "common/models/lora_targets.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rlhfd::models {

absl::StatusOr<std::vector<std::string>> ResolveLoraTargets(
    const std::vector<std::string>& target_modules) {
  if (target_modules.empty()) {
    return absl::InvalidArgumentError(
        "target_modules: is empty: give \"all-linear\" or layers among q_proj, k_proj, "
        "v_proj, o_proj, gate_proj, up_proj, down_proj");
  }
  const bool all = std::find(target_modules.begin(), target_modules.end(), "all-linear") !=
                   target_modules.end();
  if (all && target_modules.size() > 1) {
    return absl::InvalidArgumentError(
        "target_modules: \"all-linear\" already names every layer; give it alone");
  }
  std::vector<std::string> layers;
  for (const std::string_view layer : kLoraLayers) {
    if (all || std::find(target_modules.begin(), target_modules.end(), layer) !=
                   target_modules.end()) {
      layers.emplace_back(layer);
    }
  }
  for (const std::string& name : target_modules) {
    if (name == "all-linear") continue;
    if (std::find(std::begin(kLoraLayers), std::end(kLoraLayers), name) == std::end(kLoraLayers)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "target_modules: '", name, "' is not a linear layer of the decoder; give \"all-linear\" ",
          "or layers among ",
          absl::StrJoin(std::vector<std::string>(std::begin(kLoraLayers), std::end(kLoraLayers)),
                        ", ")));
    }
  }
  return layers;
}

}  // namespace rlhfd::models
