// OmegaConf-style interpolation over a JSON document; see verl_interpolation.h.
#include "common/config/verl_interpolation.h"

#include <cstdlib>
#include <optional>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/config/hydra_compose.h"
#include "common/status/status_macros.h"

namespace rlhfd::config {
namespace {

using Json = nlohmann::json;
using Path = std::vector<std::string>;

// Interpolations naming interpolations: deeper than this is a cycle in all but name.
constexpr int kMaxDepth = 32;
// Text one value may resolve to: keys that repeat each other (k1: ${k0}${k0}, k2: ${k1}${k1})
// would otherwise double it per key.
constexpr size_t kMaxResolvedBytes = size_t{1} << 20;
// What all interpolations of a document may copy in, in all: 40,000 references to a list of
// 40,000 items, or 100,000 to a 1 MiB text (a few hundred KB of YAML), would otherwise copy
// billions of values or 100 GB.
constexpr size_t kMaxCopiedValues = 1'000'000;
constexpr size_t kMaxCopiedBytes = size_t{64} << 20;

// What copying a value costs: its values (itself, and each item and field below it) and the
// bytes of its texts, counted until `values` passes kMaxCopiedValues.
struct CopyCost {
  size_t values = 0;
  size_t bytes = 0;
  void Add(const Json& value) {
    ++values;
    if (value.is_string()) bytes += value.get_ref<const std::string&>().size();
    if (!value.is_object() && !value.is_array()) return;
    for (const Json& child : value) {
      if (values > kMaxCopiedValues) return;
      Add(child);
    }
  }
};

// The end of the interpolation opening at `open` ("${"): the index of its "}", or npos.
size_t ClosingBrace(absl::string_view text, size_t open) {
  int depth = 0;
  for (size_t i = open; i < text.size(); ++i) {
    if (text[i] == '{') ++depth;
    if (text[i] == '}' && --depth == 0) return i;
  }
  return absl::string_view::npos;
}

// Splits resolver arguments at commas outside nested ${...}, [...], {...} and quotes.
std::vector<std::string> SplitArguments(absl::string_view text) {
  std::vector<std::string> out;
  int depth = 0;
  char quote = 0;
  std::string current;
  for (char c : text) {
    if (quote != 0) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      --depth;
    } else if (c == ',' && depth == 0) {
      out.push_back(std::string(absl::StripAsciiWhitespace(current)));
      current.clear();
      continue;
    }
    current += c;
  }
  out.push_back(std::string(absl::StripAsciiWhitespace(current)));
  return out;
}

// An argument without interpolations, read as OmegaConf's grammar reads one.
Json ParseScalar(absl::string_view raw) {
  const std::string text(absl::StripAsciiWhitespace(raw));
  if (text.size() >= 2 && (text.front() == '\'' || text.front() == '"') &&
      text.back() == text.front()) {
    return text.substr(1, text.size() - 2);
  }
  if (absl::AsciiStrToLower(text) == "null") return nullptr;
  if (std::optional<Json> typed = hydra::TypedScalar(text)) return *std::move(typed);
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
    Json list = Json::array();
    const absl::string_view inside = absl::string_view(text).substr(1, text.size() - 2);
    if (!absl::StripAsciiWhitespace(inside).empty()) {
      for (const std::string& item : SplitArguments(inside)) list.push_back(ParseScalar(item));
    }
    return list;
  }
  if (text == "{}") return Json::object();
  return text;
}

std::string AsText(const Json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_null()) return "None";  // what Python's str() makes of it, as OmegaConf does
  if (value.is_boolean()) return value.get<bool>() ? "True" : "False";
  return value.dump();
}

class Resolver {
 public:
  explicit Resolver(Json* root) : root_(root) {}

  // `depth`: the interpolations being resolved that led here (a mapping or list one names is
  // resolved before it is copied).
  void ResolveAll(Json* node, Path* path, std::map<std::string, std::string>* problems,
                  int depth = 0) {
    if (node->is_object()) {
      for (auto& [key, child] : node->items()) {
        path->push_back(key);
        ResolveAll(&child, path, problems, depth);
        path->pop_back();
      }
    } else if (node->is_array()) {
      for (size_t i = 0; i < node->size(); ++i) {
        path->push_back(std::to_string(i));
        ResolveAll(&(*node)[i], path, problems, depth);
        path->pop_back();
      }
    } else if (HasInterpolation(*node)) {
      if (absl::StatusOr<std::optional<Json>> value = Value(*path, depth); !value.ok()) {
        (*problems)[absl::StrJoin(*path, ".")] = std::string(value.status().message());
      }
    }
  }

 private:
  Json* Find(const Path& path) {
    Json* node = root_;
    for (const std::string& part : path) {
      if (node->is_object()) {
        auto it = node->find(part);
        if (it == node->end()) return nullptr;
        node = &*it;
      } else if (size_t index;
                 node->is_array() && absl::SimpleAtoi(part, &index) && index < node->size()) {
        node = &(*node)[index];
      } else {
        return nullptr;
      }
    }
    return node;
  }

  // The resolved value at `path` (resolved in place, so each is worked out once), or nullopt
  // where there is no such key.
  absl::StatusOr<std::optional<Json>> Value(const Path& path, int depth) {
    Json* node = Find(path);
    if (node == nullptr) return std::optional<Json>();
    const std::string key = absl::StrJoin(path, ".");
    if (depth > kMaxDepth) {
      return absl::InvalidArgumentError(absl::StrCat("`", key, "` is reached through more than ",
                                                     kMaxDepth, " interpolations in a row"));
    }
    if (node->is_object() || node->is_array()) {
      std::map<std::string, std::string> problems;
      Path walk = path;
      ResolveAll(node, &walk, &problems, depth + 1);
      if (!problems.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(problems.begin()->first, ": ", problems.begin()->second));
      }
      RETURN_IF_ERROR(Copying(*node, key));
      return std::optional<Json>(*node);
    }
    if (!HasInterpolation(*node)) {
      RETURN_IF_ERROR(Copying(*node, key));
      return std::optional<Json>(*node);
    }
    if (!in_progress_.insert(key).second) {
      return absl::InvalidArgumentError(absl::StrCat("`", key, "` refers to itself"));
    }
    absl::StatusOr<Json> resolved = Text(node->get<std::string>(), path, depth + 1);
    in_progress_.erase(key);
    if (!resolved.ok()) return resolved.status();
    *node = *resolved;
    RETURN_IF_ERROR(Copying(*node, key));
    return std::optional<Json>(*std::move(resolved));
  }

  // Charges a copy of `value` (the value at `key`) to the document's bounds.
  absl::Status Copying(const Json& value, const std::string& key) {
    copied_.Add(value);
    if (copied_.values <= kMaxCopiedValues && copied_.bytes <= kMaxCopiedBytes) {
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        absl::StrCat("interpolations copy more than ", kMaxCopiedValues, " values or ",
                     kMaxCopiedBytes >> 20, " MiB in all (reached at `", key,
                     "`): refer to large mappings, lists and texts fewer "
                     "times"));
  }

  // `text`, the value at `where`, with its interpolations replaced.
  absl::StatusOr<Json> Text(const std::string& text, const Path& where, int depth) {
    const size_t first = text.find("${");
    if (first == 0 && ClosingBrace(text, 1) == text.size() - 1) {
      return Expression(absl::string_view(text).substr(2, text.size() - 3), where, depth);
    }
    std::string out;
    size_t at = 0;
    while (at < text.size()) {
      const size_t open = text.find("${", at);
      if (open == std::string::npos) {
        out += text.substr(at);
        break;
      }
      if (open > 0 && text[open - 1] == '\\') {  // an escaped \${ is text
        out += text.substr(at, open - 1 - at) + "${";
        at = open + 2;
        continue;
      }
      const size_t close = ClosingBrace(text, open + 1);
      if (close == std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat("'", text, "' has an unclosed ${"));
      }
      out += text.substr(at, open - at);
      ASSIGN_OR_RETURN(
          Json part,
          Expression(absl::string_view(text).substr(open + 2, close - open - 2), where, depth));
      out += AsText(part);
      if (out.size() > kMaxResolvedBytes) {
        return absl::InvalidArgumentError(absl::StrCat("resolves to more than ",
                                                       kMaxResolvedBytes >> 20,
                                                       " MiB of text (interpolations "
                                                       "that repeat each other)"));
      }
      at = close + 1;
    }
    return Json(out);
  }

  // A key path as OmegaConf reads it: absolute, or relative to the mapping holding `where`
  // (one leading dot: that mapping; each further dot one level up).
  absl::StatusOr<Path> KeyPath(const std::string& text, const Path& where) {
    size_t dots = 0;
    while (dots < text.size() && text[dots] == '.') ++dots;
    Path path;
    if (dots > 0) {
      if (dots > where.size()) {
        return absl::InvalidArgumentError(absl::StrCat("`", text, "` climbs above the top"));
      }
      path.assign(where.begin(), where.end() - static_cast<std::ptrdiff_t>(dots));
    }
    const absl::string_view rest = absl::string_view(text).substr(dots);
    if (!rest.empty()) {
      for (absl::string_view part : absl::StrSplit(rest, '.')) path.emplace_back(part);
    }
    return path;
  }

  // An argument: a scalar, or text with interpolations of its own.
  absl::StatusOr<Json> Argument(const std::string& text, const Path& where, int depth) {
    if (absl::StrContains(text, "${")) return Text(text, where, depth + 1);
    return ParseScalar(text);
  }

  absl::StatusOr<Json> Expression(absl::string_view raw, const Path& where, int depth) {
    if (depth > kMaxDepth) return absl::InvalidArgumentError("interpolations nest too deeply");
    const std::string inner(absl::StripAsciiWhitespace(raw));
    const size_t colon = inner.find(':');
    const size_t nested = inner.find("${");
    if (colon != std::string::npos && (nested == std::string::npos || colon < nested)) {
      const std::string name = inner.substr(0, colon);
      const std::vector<std::string> args = SplitArguments(inner.substr(colon + 1));
      if (name == "oc.select") {
        ASSIGN_OR_RETURN(Json key, Argument(args[0], where, depth));
        if (!key.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat("oc.select of '", AsText(key), "'"));
        }
        ASSIGN_OR_RETURN(Path path, KeyPath(key.get<std::string>(), where));
        ASSIGN_OR_RETURN(std::optional<Json> value, Value(path, depth));
        if (value.has_value()) return *std::move(value);
        if (args.size() < 2) return Json(nullptr);
        return Argument(args[1], where, depth);
      }
      if (name == "oc.env") {
        ASSIGN_OR_RETURN(Json variable, Argument(args[0], where, depth));
        if (const char* set = std::getenv(AsText(variable).c_str()); set != nullptr) {
          return Json(set);
        }
        if (args.size() < 2) {
          return absl::InvalidArgumentError(
              absl::StrCat("environment variable ", AsText(variable), " is not set"));
        }
        ASSIGN_OR_RETURN(Json fallback, Argument(args[1], where, depth));
        return fallback.is_null() ? fallback : Json(AsText(fallback));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "the resolver '", name, "' is not one verl's configs use (oc.select, oc.env)"));
    }
    ASSIGN_OR_RETURN(Json key, Argument(inner, where, depth));
    ASSIGN_OR_RETURN(Path path, KeyPath(AsText(key), where));
    ASSIGN_OR_RETURN(std::optional<Json> value, Value(path, depth));
    if (!value.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("`", absl::StrJoin(path, "."), "` is not a key of the config"));
    }
    return *std::move(value);
  }

  Json* root_;
  std::set<std::string> in_progress_;
  CopyCost copied_;
};

}  // namespace

bool HasInterpolation(const Json& value) {
  if (value.is_array()) {
    for (const Json& item : value) {
      if (HasInterpolation(item)) return true;
    }
    return false;
  }
  return value.is_string() && absl::StrContains(value.get_ref<const std::string&>(), "${");
}

std::map<std::string, std::string> ResolveInterpolations(Json* document) {
  std::map<std::string, std::string> problems;
  Path path;
  Resolver(document).ResolveAll(document, &path, &problems);
  return problems;
}

}  // namespace rlhfd::config
