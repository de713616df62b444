// OmegaConf's interpolations, for the forms verl's configs use: `${a.b}`, relative `${.x}` and
// `${..x}`, `${oc.select:a.b,default}`, `${oc.env:VAR,default}`, nested ones
// (`${oc.select:a,${oc.select:b,null}}`) and strings that embed them (`ckpt/${a}/${b}`).
// A value that is one interpolation takes the type of what it names; one embedded in text
// becomes text, as in OmegaConf.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace rlhfd::config {

// Resolves every interpolation in `document` in place (a mapping of mappings, lists and typed
// scalars). Returns the dotted keys it could not resolve, each with why (a key that does not
// exist, a resolver OmegaConf has but verl's configs do not use, a cycle); those keep their text.
std::map<std::string, std::string> ResolveInterpolations(nlohmann::json* document);

// Whether `value` is (or, in a list, holds) text with an interpolation left in it.
bool HasInterpolation(const nlohmann::json& value);

}  // namespace rlhfd::config
