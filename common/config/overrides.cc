// Dotted-key overrides; see overrides.h.
#include "common/config/overrides.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/config/config_document.h"
#include "common/util/text.h"

namespace rlhfd::config {
namespace {

constexpr size_t kMaxOverrides = 256;
constexpr size_t kMaxOverrideBytes = 64 << 10;

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
  return parts;
}

// Applies one override to `document`.
absl::Status ApplyOverride(const std::string& override_text, nlohmann::json* document) {
  if (override_text.size() > kMaxOverrideBytes || !IsValidUtf8(override_text)) {
    return Bad(override_text, "must be UTF-8 text of at most 64 KiB");
  }
  absl::string_view text = override_text;
  if (absl::ConsumePrefix(&text, "~")) {
    auto parts = SplitKey(override_text, absl::StripAsciiWhitespace(text));
    if (!parts.ok()) return parts.status();
    nlohmann::json* node = document;
    for (size_t i = 0; i + 1 < parts->size(); ++i) {
      if (!node->is_object() || !node->contains((*parts)[i])) break;
      node = &(*node)[(*parts)[i]];
    }
    if (node->is_object()) node->erase(parts->back());
    return absl::OkStatus();
  }
  if (!absl::ConsumePrefix(&text, "++")) absl::ConsumePrefix(&text, "+");
  const size_t equals = text.find('=');
  if (equals == absl::string_view::npos) {
    return Bad(override_text, "expected key.path=value (or ~key.path to remove a key)");
  }
  auto parts = SplitKey(override_text, absl::StripAsciiWhitespace(text.substr(0, equals)));
  if (!parts.ok()) return parts.status();
  // The value, as YAML, through the config parser's bounds.
  auto parsed = ParseConfigDocument(absl::StrCat("v: ", text.substr(equals + 1), "\n"), "override");
  if (!parsed.ok()) {
    return Bad(override_text,
               absl::StrCat("the value is not YAML (",
                            SanitizeForDisplay(parsed.status().message(), 120), ")"));
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
