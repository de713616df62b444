// Dotted-key overrides; see overrides.h.
#include "common/config/overrides.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/config/config_document.h"
#include "common/config/hydra_compose.h"
#include "common/util/text.h"

namespace rlhfd::config {
namespace {

constexpr size_t kMaxOverrides = 256;
constexpr size_t kMaxOverrideBytes = 64 << 10;
// Parts of a key: a document no deeper than the parser allows (a.a.a...=1 in 64 KiB would
// nest 32,767 levels, which every later walk of the document recurses through).
constexpr size_t kMaxKeyParts = 32;

absl::Status Bad(absl::string_view override_text, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("override '", SanitizeForDisplay(override_text, 80),
                                                 "': ", problem));
}

absl::StatusOr<std::vector<std::string>> SplitKey(absl::string_view override_text,
                                                  absl::string_view key) {
  std::vector<std::string> parts = absl::StrSplit(key, '.');
  for (const std::string& part : parts) {
    if (part.empty()) return Bad(override_text, "the key has an empty part; write a.b.c=value");
  }
  if (parts.size() > kMaxKeyParts) {
    return Bad(override_text, absl::StrCat("the key has more than ", kMaxKeyParts, " parts"));
  }
  return parts;
}

// Applies one override to `document`.
absl::Status ApplyOverride(const std::string& override_text, nlohmann::json* document) {
  if (override_text.size() > kMaxOverrideBytes || !IsValidUtf8(override_text)) {
    return Bad(override_text, "must be UTF-8 text of at most 64 KiB");
  }
  absl::string_view text = override_text;
  const bool remove = absl::ConsumePrefix(&text, "~");
  if (!remove && !absl::ConsumePrefix(&text, "++")) absl::ConsumePrefix(&text, "+");
  const size_t equals = text.find('=');
  if (equals == absl::string_view::npos && !remove) {
    return Bad(override_text, "expected key.path=value (or ~key.path to remove a key)");
  }
  auto parts = SplitKey(override_text, absl::StripAsciiWhitespace(text.substr(0, equals)));
  if (!parts.ok()) return parts.status();
  // The value, as YAML, through the config parser's bounds. Nothing after '=' (a shell variable
  // that was not set) is refused: read as null it would quietly mean the default.
  absl::StatusOr<nlohmann::json> parsed;
  if (equals != absl::string_view::npos) {
    const absl::string_view value = text.substr(equals + 1);
    if (absl::StripAsciiWhitespace(value).empty()) {
      return Bad(override_text,
                 "no value after '=' (a shell variable that is not set?): write key=null for "
                 "none, or key='' for empty text");
    }
    parsed = ParseConfigDocument(absl::StrCat("v: ", value, "\n"), "override");
    if (!parsed.ok()) {
      return Bad(override_text,
                 absl::StrCat("the value is not YAML (",
                              SanitizeForDisplay(parsed.status().message(), 120), ")"));
    }
  }
  if (remove) {
    // As Hydra: the key must be there, and with ~key=value hold that value.
    nlohmann::json* node = document;
    for (size_t i = 0; i < parts->size(); ++i) {
      if (!node->is_object() || !node->contains((*parts)[i])) {
        return Bad(override_text,
                   absl::StrCat("there is no key '",
                                absl::StrJoin(parts->begin(), parts->begin() + i + 1, "."),
                                "' to remove"));
      }
      if (i + 1 < parts->size()) node = &(*node)[(*parts)[i]];
    }
    // Compared typed, as Hydra compares (True is true, 1e-6 is 1e-06); a document's scalars
    // may still be the parser's text.
    if (parsed.ok() && hydra::Typed((*node)[parts->back()]) != hydra::Typed((*parsed)["v"])) {
      return Bad(override_text, absl::StrCat("the key holds ",
                                             SanitizeForDisplay((*node)[parts->back()].dump(), 80),
                                             ", not the value given"));
    }
    node->erase(parts->back());
    return absl::OkStatus();
  }
  nlohmann::json* node = document;
  for (size_t i = 0; i + 1 < parts->size(); ++i) {
    nlohmann::json& child = (*node)[(*parts)[i]];
    if (child.is_null()) child = nlohmann::json::object();
    if (!child.is_object()) {
      return Bad(override_text, absl::StrCat("'", (*parts)[i], "' holds a value, not keys"));
    }
    node = &child;
  }
  (*node)[parts->back()] = std::move((*parsed)["v"]);
  return absl::OkStatus();
}

absl::Status TooMany(const std::vector<std::string>& overrides) {
  if (overrides.size() <= kMaxOverrides) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(overrides.size(), " overrides; at most ", kMaxOverrides, " are accepted"));
}

}  // namespace

absl::Status ApplyOverrides(const std::vector<std::string>& overrides, nlohmann::json* document) {
  if (absl::Status many = TooMany(overrides); !many.ok()) return many;
  for (const std::string& override_text : overrides) {
    if (absl::Status applied = ApplyOverride(override_text, document); !applied.ok()) {
      return applied;
    }
  }
  return absl::OkStatus();
}

bool ApplyOverrides(const std::vector<std::string>& overrides, nlohmann::json* document,
                    ConfigErrors* errors) {
  if (absl::Status many = TooMany(overrides); !many.ok()) {
    errors->Add("", many.message());
    return false;
  }
  for (const std::string& override_text : overrides) {
    if (absl::Status applied = ApplyOverride(override_text, document); !applied.ok()) {
      errors->Add("", applied.message());
    }
  }
  return true;
}

}  // namespace rlhfd::config
