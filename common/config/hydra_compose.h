// How Hydra composes a verl config, on JSON documents: YAML plain scalars typed as YAML types
// them, a config laid over its defaults mapping by mapping, leaves as dotted keys, and a value
// set at a dotted path. convert-verl composes verl's defaults, a verl YAML and overrides with it.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "nlohmann/json.hpp"

namespace rlhfd::config::hydra {

// `text` as a YAML (and OmegaConf) plain scalar types it: true/false in any case, an integer or
// a finite number; nullopt for text that stays text.
std::optional<nlohmann::json> TypedScalar(const std::string& text);

// "True", "512" and "1e-6" as YAML (and Hydra) would make them; other values as they are.
nlohmann::json Typed(const nlohmann::json& value);

// Every scalar of `node` typed as Typed types it.
void TypeAll(nlohmann::json* node);

// `over` laid over `base`, mapping by mapping.
void MergeInto(nlohmann::json* base, const nlohmann::json& over);

// The document's leaves (typed) as dotted keys under `path`; lists and empty mappings are leaves.
void Flatten(const nlohmann::json& node, const std::string& path,
             std::map<std::string, nlohmann::json>* out);

// `value` at the dotted `path` of `config`, making the mappings on the way.
void Set(nlohmann::json* config, const std::string& path, nlohmann::json value);

}  // namespace rlhfd::config::hydra
