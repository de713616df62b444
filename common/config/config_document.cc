// YAML (yaml-cpp's event parser) and JSON (nlohmann's SAX parser) front ends of the config
// loader, each building the document within a budget.
#include "common/config/config_document.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>
#include <yaml-cpp/yaml.h>

#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/container/flat_hash_set.h"
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

  // `values` more values at `depth`, holding `scalar_bytes` of text.
  absl::Status Take(int depth, int64_t values, int64_t scalar_bytes) {
    if (depth > limits_.max_depth) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_, ": nested deeper than ", limits_.max_depth, " levels; a job config is flat"));
    }
    values_ += values;
    if (values_ > limits_.max_values) {
      return absl::InvalidArgumentError(absl::StrCat(
          source_, ": more than ", limits_.max_values,
          " values (after expanding YAML aliases); a job config holds a few hundred"));
    }
    scalar_bytes_ += scalar_bytes;
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

// Adds `key`, which `object` does not hold (the builders check), and returns its value: an
// ordered object's key is appended without the search its operator[] would make.
template <typename JsonT>
JsonT* AddNewKey(JsonT& object, std::string key, JsonT value) {
  auto& entries = object.template get_ref<typename JsonT::object_t&>();
  if constexpr (std::is_same_v<JsonT, nlohmann::ordered_json>) {
    entries.emplace_back(std::move(key), std::move(value));
    return &entries.back().second;
  } else {
    return &entries.emplace(std::move(key), std::move(value)).first->second;
  }
}

// Stops a YAML parse from inside the event handler (yaml-cpp's handlers return nothing); caught
// in ParseYaml and turned back into the status it carries.
struct YamlRefusal {
  absl::Status status;
};

// Builds the JSON document from yaml-cpp's parse events, never its node graph: the budget is
// charged as values arrive and before an alias is copied, so neither a long document nor an
// alias bomb is ever built in memory. Anchored values are kept with their sizes for aliases.
// `JsonT` as BoundedJsonBuilder's.
template <typename JsonT>
class BoundedYamlBuilder final : public YAML::EventHandler {
  using Json = JsonT;

 public:
  BoundedYamlBuilder(absl::string_view source, Budget& budget) : source_(source), budget_(budget) {}

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override { done_ = true; }

  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    Value(mark, Json(nullptr), 0, anchor);
  }
  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                const std::string& value) override {
    if (!IsValidUtf8(value)) Refuse(mark, NotUtf8(expecting_key() ? "a key" : "a value"));
    // Plain "~" / "null" are YAML nulls; quoted ones are strings.
    const bool null = tag == "?" && (value == "~" || value == "null");
    Value(mark, null ? Json(nullptr) : Json(value), value.size(), anchor);
  }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    auto it = anchors_.find(anchor);
    if (it == anchors_.end()) Refuse(mark, "an alias refers to an anchor that is not complete");
    const Anchored& anchored = it->second;
    // Charged in full before the copy is made.
    Charge(mark, anchored.values, anchored.bytes);
    Place(mark, Json(anchored.value));
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    Open(mark, Json::array(), anchor);
  }
  void OnSequenceEnd() override { Close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    Open(mark, Json::object(), anchor);
  }
  void OnMapEnd() override { Close(); }

  absl::StatusOr<Json> Take() && {
    if (!done_) return absl::InvalidArgumentError(absl::StrCat(source_, ": the YAML is empty"));
    return std::move(root_);
  }

 private:
  struct Frame {
    Json* container;
    YAML::anchor_t anchor;
    int64_t values_at_start;
    int64_t bytes_at_start;
    bool expecting_key = true;  // Mappings alternate key, value.
    std::string key;
    absl::flat_hash_set<std::string> keys = {};  // a mapping's, so far
  };
  struct Anchored {
    Json value;
    int64_t values;
    int64_t bytes;
  };

  [[noreturn]] void Refuse(const YAML::Mark& mark, absl::string_view message) {
    throw YamlRefusal{
        absl::InvalidArgumentError(absl::StrCat(source_, ": ", LineOf(mark), ": ", message))};
  }
  static std::string NotUtf8(absl::string_view what) {
    return absl::StrCat(what,
                        " is not valid UTF-8 (a YAML escape such as \\_ or \\N, or a file in "
                        "another encoding); save the file as UTF-8");
  }
  bool expecting_key() const {
    return !stack_.empty() && stack_.back().container->is_object() && stack_.back().expecting_key;
  }
  void Charge(const YAML::Mark& mark, int64_t values, int64_t bytes) {
    absl::Status taken = budget_.Take(static_cast<int>(stack_.size()), values, bytes);
    if (!taken.ok()) throw YamlRefusal{taken};
    values_ += values;
    bytes_ += bytes;
  }
  // Puts a charged value where the document is at: the root, the next item of a list, a
  // mapping's key, or the value of the key before it. Returns where it landed (null for a key).
  Json* Place(const YAML::Mark& mark, Json value) {
    if (stack_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    Frame& frame = stack_.back();
    Json& container = *frame.container;
    if (container.is_array()) {
      container.push_back(std::move(value));
      return &container.back();
    }
    if (frame.expecting_key) {
      if (!value.is_string()) Refuse(mark, "keys must be plain names");
      std::string key = value.template get<std::string>();
      // YAML 1.1's merge key: read as a key of its own it would quietly drop what it merges.
      if (key == "<<")
        Refuse(mark, "merge keys (<<: *anchor) are not supported: write the keys out");
      if (!frame.keys.insert(key).second) {
        Refuse(mark, absl::StrCat("key '", SanitizeForDisplay(key, 80), "' appears twice"));
      }
      frame.key = std::move(key);
      frame.expecting_key = false;
      return nullptr;
    }
    frame.expecting_key = true;
    return AddNewKey(container, std::move(frame.key), std::move(value));
  }
  void Value(const YAML::Mark& mark, Json value, size_t bytes, YAML::anchor_t anchor) {
    Charge(mark, 1, static_cast<int64_t>(bytes));
    Json* placed = Place(mark, std::move(value));
    if (anchor != 0) {
      if (placed == nullptr) Refuse(mark, "anchors on keys are not supported");
      anchors_[anchor] = {*placed, 1, static_cast<int64_t>(bytes)};
    }
  }
  void Open(const YAML::Mark& mark, Json container, YAML::anchor_t anchor) {
    if (expecting_key()) Refuse(mark, "keys must be plain names");
    const int64_t values_before = values_, bytes_before = bytes_;
    Charge(mark, 1, 0);
    stack_.push_back({Place(mark, std::move(container)), anchor, values_before, bytes_before});
  }
  void Close() {
    Frame frame = std::move(stack_.back());
    stack_.pop_back();
    if (frame.anchor != 0) {
      anchors_[frame.anchor] = {*frame.container, values_ - frame.values_at_start,
                                bytes_ - frame.bytes_at_start};
    }
  }

  absl::string_view source_;
  Budget& budget_;
  Json root_;
  bool done_ = false;
  std::vector<Frame> stack_;
  std::map<YAML::anchor_t, Anchored> anchors_;
  int64_t values_ = 0;
  int64_t bytes_ = 0;
};

// Builds the DOM like nlohmann's own builder, but within the budget and refusing duplicate keys;
// returning false stops the parse at once. `JsonT` is nlohmann::json (keys sorted) or
// nlohmann::ordered_json (keys in the text's order): each open object's keys are also kept in a
// hash set, so that neither finding a duplicate nor adding a key is linear in an ordered object's
// size (a line of a million keys is within the limits; absl's hash is seeded per process, so
// colliding keys cannot be chosen ahead).
template <typename JsonT>
class BoundedJsonBuilder final : public nlohmann::json_sax<JsonT> {
  using Sax = nlohmann::json_sax<JsonT>;

 public:
  BoundedJsonBuilder(absl::string_view source, Budget& budget)
      : source_(source), budget_(budget) {}

  bool null() override { return Add(JsonT(nullptr), 0); }
  bool boolean(bool value) override { return Add(JsonT(value), 0); }
  bool number_integer(typename Sax::number_integer_t value) override {
    return Add(JsonT(value), 0);
  }
  bool number_unsigned(typename Sax::number_unsigned_t value) override {
    return Add(JsonT(value), 0);
  }
  bool number_float(typename Sax::number_float_t value, const typename Sax::string_t&) override {
    return Add(JsonT(value), 0);
  }
  bool string(typename Sax::string_t& value) override {
    const size_t bytes = value.size();
    return Add(JsonT(std::move(value)), bytes);
  }
  bool binary(typename Sax::binary_t&) override { return Fail("binary values are not JSON"); }
  bool start_object(std::size_t) override { return Open(JsonT::object()); }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(JsonT::array()); }
  bool end_array() override { return Close(); }
  bool key(typename Sax::string_t& value) override {
    if (!Take(value.size())) return false;
    if (!stack_.back().keys.insert(value).second) {
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

  absl::StatusOr<JsonT> Take() && {
    if (!status_.ok()) return status_;
    return std::move(root_);
  }

 private:
  struct OpenContainer {
    JsonT* container;
    absl::flat_hash_set<std::string> keys;  // an object's, so far
  };

  bool Take(size_t bytes) {
    absl::Status taken =
        budget_.Take(static_cast<int>(stack_.size()), 1, static_cast<int64_t>(bytes));
    if (!taken.ok()) status_ = taken;
    return taken.ok();
  }
  bool Fail(absl::string_view message) {
    status_ = absl::InvalidArgumentError(absl::StrCat(source_, ": ", message));
    return false;
  }
  // Pointers into a container stay valid while it is on the stack: only the innermost open
  // container grows.
  JsonT* Place(JsonT value) {
    if (stack_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    JsonT& parent = *stack_.back().container;
    if (parent.is_array()) {
      parent.push_back(std::move(value));
      return &parent.back();
    }
    return AddNewKey(parent, std::move(key_), std::move(value));
  }
  bool Add(JsonT value, size_t bytes) {
    if (!Take(bytes)) return false;
    Place(std::move(value));
    return true;
  }
  bool Open(JsonT container) {
    if (!Take(0)) return false;
    stack_.push_back({Place(std::move(container)), {}});
    return true;
  }
  bool Close() {
    stack_.pop_back();
    return true;
  }

  absl::string_view source_;
  Budget& budget_;
  JsonT root_;
  std::vector<OpenContainer> stack_;
  std::string key_;
  absl::Status status_;
};

template <typename JsonT>
absl::StatusOr<JsonT> ParseJson(absl::string_view text, absl::string_view source, Budget& budget) {
  BoundedJsonBuilder<JsonT> builder(source, budget);
  try {
    JsonT::sax_parse(text.begin(), text.end(), &builder, JsonT::input_format_t::json,
                     /*strict=*/true);
  } catch (const std::exception& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": invalid JSON: ", SanitizeForDisplay(error.what(), 300)));
  }
  return std::move(builder).Take();
}

template <typename JsonT>
absl::StatusOr<JsonT> ParseYaml(absl::string_view text, absl::string_view source, Budget& budget) {
  std::istringstream stream{std::string(text)};
  BoundedYamlBuilder<JsonT> builder(source, budget);
  try {
    YAML::Parser parser(stream);
    parser.HandleNextDocument(builder);
  } catch (const YamlRefusal& refusal) {
    return refusal.status;
  } catch (const YAML::Exception& error) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": invalid YAML at line ", error.mark.line + 1, ", column ", error.mark.column + 1,
        ": ", SanitizeForDisplay(error.msg, 300)));
  }
  return std::move(builder).Take();
}

template <typename JsonT>
absl::StatusOr<JsonT> ParseDocument(absl::string_view text, absl::string_view source,
                                    const DocumentLimits& limits) {
  if (text.size() > limits.max_text_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", text.size(),
                                                   " bytes is larger than a config may be (",
                                                   limits.max_text_bytes, " bytes)"));
  }
  Budget budget(limits, source);
  absl::StatusOr<JsonT> document;
  try {
    document = absl::EndsWith(source, ".json") ? ParseJson<JsonT>(text, source, budget)
                                               : ParseYaml<JsonT>(text, source, budget);
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

}  // namespace

absl::StatusOr<Json> ParseConfigDocument(absl::string_view text, absl::string_view source,
                                         const DocumentLimits& limits) {
  return ParseDocument<Json>(text, source, limits);
}

absl::StatusOr<nlohmann::ordered_json> ParseOrderedConfigDocument(absl::string_view text,
                                                                  absl::string_view source,
                                                                  const DocumentLimits& limits) {
  return ParseDocument<nlohmann::ordered_json>(text, source, limits);
}

absl::StatusOr<nlohmann::ordered_json> ParseBoundedJson(absl::string_view text,
                                                        absl::string_view source,
                                                        const DocumentLimits& limits) {
  if (text.size() > limits.max_text_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", text.size(),
                                                   " bytes is more than the ",
                                                   limits.max_text_bytes, " allowed"));
  }
  Budget budget(limits, source);
  try {
    return ParseJson<nlohmann::ordered_json>(text, source, budget);
  } catch (const std::exception& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": cannot parse: ", SanitizeForDisplay(error.what(), 300)));
  }
}

}  // namespace rlhfd::config
