// YAML (yaml-cpp) and JSON (nlohmann, through a bounded SAX builder) front ends of the config
// loader.
#include "common/config/config_document.h"

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/util/text.h"

namespace rlhfd::config {
namespace {

using Json = nlohmann::json;

// Counts what a document expands to, and says which limit it passed.
class Budget {
 public:
  Budget(const DocumentLimits& limits, absl::string_view source)
      : limits_(limits), source_(source) {}

  // One more value at `depth`, holding `scalar_bytes` of text.
  absl::Status Take(int depth, size_t scalar_bytes) {
    if (depth > limits_.max_depth) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_, ": nested deeper than ", limits_.max_depth, " levels; a job config is flat"));
    }
    if (++values_ > limits_.max_values) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_, ": more than ", limits_.max_values,
          " values (after expanding YAML aliases); a job config holds a few hundred"));
    }
    scalar_bytes_ += static_cast<int64_t>(scalar_bytes);
    if (scalar_bytes_ > limits_.max_scalar_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(source_, ": more than ", limits_.max_scalar_bytes,
                       " bytes of keys and values (after expanding YAML aliases)"));
    }
    return absl::OkStatus();
  }

 private:
  const DocumentLimits& limits_;
  absl::string_view source_;
  int64_t values_ = 0;
  int64_t scalar_bytes_ = 0;
};

std::string LineOf(const YAML::Mark& mark) { return absl::StrCat("line ", mark.line + 1); }

absl::Status CheckUtf8(absl::string_view text, absl::string_view source, const YAML::Mark& mark,
                       absl::string_view what) {
  if (IsValidUtf8(text)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": ", LineOf(mark), ": ", what,
                   " is not valid UTF-8 (a YAML escape such as \\_ or \\N, or a file in another "
                   "encoding); save the file as UTF-8"));
}

absl::StatusOr<Json> YamlToJson(const YAML::Node& node, absl::string_view source, int depth,
                                Budget& budget) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      if (auto taken = budget.Take(depth, 0); !taken.ok()) return taken;
      return Json(nullptr);
    case YAML::NodeType::Scalar: {
      const std::string& text = node.Scalar();
      if (auto taken = budget.Take(depth, text.size()); !taken.ok()) return taken;
      if (auto valid = CheckUtf8(text, source, node.Mark(), "a value"); !valid.ok()) return valid;
      // Plain "~" / "null" are YAML nulls; quoted ones are strings.
      if (node.Tag() == "?" && (text == "~" || text == "null")) return Json(nullptr);
      return Json(text);
    }
    case YAML::NodeType::Sequence: {
      if (auto taken = budget.Take(depth, 0); !taken.ok()) return taken;
      Json array = Json::array();
      for (const YAML::Node& item : node) {
        auto value = YamlToJson(item, source, depth + 1, budget);
        if (!value.ok()) return value.status();
        array.push_back(*std::move(value));
      }
      return array;
    }
    case YAML::NodeType::Map: {
      if (auto taken = budget.Take(depth, 0); !taken.ok()) return taken;
      Json object = Json::object();
      for (const auto& entry : node) {
        if (!entry.first.IsScalar()) {
          return absl::InvalidArgumentError(absl::StrCat(source, ": ", LineOf(entry.first.Mark()),
                                                         ": keys must be plain names"));
        }
        const std::string& key = entry.first.Scalar();
        if (auto taken = budget.Take(depth + 1, key.size()); !taken.ok()) return taken;
        if (auto valid = CheckUtf8(key, source, entry.first.Mark(), "a key"); !valid.ok()) {
          return valid;
        }
        if (object.contains(key)) {
          return absl::InvalidArgumentError(
              absl::StrCat(source, ": ", LineOf(entry.first.Mark()), ": key '",
                           SanitizeForDisplay(key, 80), "' appears twice"));
        }
        auto value = YamlToJson(entry.second, source, depth + 1, budget);
        if (!value.ok()) return value.status();
        object[key] = *std::move(value);
      }
      return object;
    }
  }
  return absl::InternalError("unknown YAML node type");
}

// Builds the DOM like nlohmann's own builder, but within the budget and refusing duplicate keys;
// returning false stops the parse at once.
class BoundedJsonBuilder final : public nlohmann::json_sax<Json> {
 public:
  BoundedJsonBuilder(absl::string_view source, Budget& budget)
      : source_(source), budget_(budget) {}

  bool null() override { return Add(Json(nullptr), 0); }
  bool boolean(bool value) override { return Add(Json(value), 0); }
  bool number_integer(number_integer_t value) override { return Add(Json(value), 0); }
  bool number_unsigned(number_unsigned_t value) override { return Add(Json(value), 0); }
  bool number_float(number_float_t value, const string_t&) override {
    return Add(Json(value), 0);
  }
  bool string(string_t& value) override {
    const size_t bytes = value.size();
    return Add(Json(std::move(value)), bytes);
  }
  bool binary(binary_t&) override { return Fail("binary values are not JSON"); }
  bool start_object(std::size_t) override { return Open(Json::object()); }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(Json::array()); }
  bool end_array() override { return Close(); }
  bool key(string_t& value) override {
    if (!Take(value.size())) return false;
    Json& object = *stack_.back();
    if (object.contains(value)) {
      return Fail(absl::StrCat("key '", SanitizeForDisplay(value, 80), "' appears twice"));
    }
    key_ = std::move(value);
    return true;
  }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& error) override {
    // The byte offset is in the message already ("at line 1, column 5").
    status_ = absl::InvalidArgumentError(
        absl::StrCat(source_, ": invalid JSON at byte ", position, ": ",
                     SanitizeForDisplay(error.what(), 300)));
    return false;
  }

  absl::StatusOr<Json> Take() && {
    if (!status_.ok()) return status_;
    return std::move(root_);
  }

 private:
  bool Take(size_t bytes) {
    absl::Status taken = budget_.Take(static_cast<int>(stack_.size()), bytes);
    if (!taken.ok()) status_ = taken;
    return taken.ok();
  }
  bool Fail(absl::string_view message) {
    status_ = absl::InvalidArgumentError(absl::StrCat(source_, ": ", message));
    return false;
  }
  Json* Place(Json value) {
    if (stack_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    Json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    Json& slot = parent[key_];
    slot = std::move(value);
    return &slot;
  }
  bool Add(Json value, size_t bytes) {
    if (!Take(bytes)) return false;
    Place(std::move(value));
    return true;
  }
  bool Open(Json container) {
    if (!Take(0)) return false;
    stack_.push_back(Place(std::move(container)));
    return true;
  }
  bool Close() {
    stack_.pop_back();
    return true;
  }

  absl::string_view source_;
  Budget& budget_;
  Json root_;
  std::vector<Json*> stack_;
  std::string key_;
  absl::Status status_;
};

absl::StatusOr<Json> ParseJson(absl::string_view text, absl::string_view source, Budget& budget) {
  BoundedJsonBuilder builder(source, budget);
  try {
    Json::sax_parse(text.begin(), text.end(), &builder, nlohmann::json::input_format_t::json,
                    /*strict=*/true);
  } catch (const std::exception& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": invalid JSON: ", SanitizeForDisplay(error.what(), 300)));
  }
  return std::move(builder).Take();
}

absl::StatusOr<Json> ParseYaml(absl::string_view text, absl::string_view source, Budget& budget) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& error) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": invalid YAML at line ", error.mark.line + 1, ", column ", error.mark.column + 1,
        ": ", SanitizeForDisplay(error.msg, 300)));
  }
  return YamlToJson(root, source, 0, budget);
}

}  // namespace

absl::StatusOr<Json> ParseConfigDocument(absl::string_view text, absl::string_view source,
                                         const DocumentLimits& limits) {
  if (text.size() > limits.max_text_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", text.size(),
                                                   " bytes is larger than a config may be (",
                                                   limits.max_text_bytes, " bytes)"));
  }
  Budget budget(limits, source);
  absl::StatusOr<Json> document;
  try {
    document = absl::EndsWith(source, ".json") ? ParseJson(text, source, budget)
                                               : ParseYaml(text, source, budget);
  } catch (const std::exception& error) {
    // yaml-cpp and nlohmann throw more than their documented exceptions (bad_alloc, a node
    // conversion): whatever it is, the input is refused and the process goes on.
    return absl::InvalidArgumentError(absl::StrCat(source, ": cannot parse the config: ",
                                                   SanitizeForDisplay(error.what(), 300)));
  }
  if (!document.ok()) return document.status();
  if (!document->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the top level must be a mapping of keys (name:, model:, ...)"));
  }
  return document;
}

}  // namespace rlhfd::config
