// Config printing; see config_printer.h.
#include "common/config/config_printer.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/json_util.h>

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/config/proto_json_schema.h"

namespace rlhfd::config {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// Proto JSON prints 64-bit integers as strings and enums by full name; config documents use
// numbers and short names.
void Normalize(const Descriptor& schema, nlohmann::json* object) {
  // An enum left at its UNSPECIFIED value (trainer.mode sft's unused estimator) is not printed:
  // no config can name that value, and a printed config must read back as the same job.
  std::vector<std::string> unset;
  for (auto& [key, value] : object->items()) {
    const FieldDescriptor* field = schema.FindFieldByName(key);
    if (field == nullptr || field->cpp_type() != FieldDescriptor::CPPTYPE_ENUM ||
        field->is_repeated() || !value.is_string()) {
      continue;
    }
    const auto* named = field->enum_type()->FindValueByName(value.get<std::string>());
    if (named != nullptr && named->number() == 0) unset.push_back(key);
  }
  for (const std::string& key : unset) object->erase(key);
  for (auto& [key, value] : object->items()) {
    const FieldDescriptor* field = schema.FindFieldByName(key);
    if (field == nullptr) continue;
    const auto fix = [&](nlohmann::json& item) {
      if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && item.is_object()) {
        Normalize(*field->message_type(), &item);
      } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_ENUM && item.is_string()) {
        if (const auto* e = field->enum_type()->FindValueByName(item.get<std::string>())) {
          item = EnumConfigName(*e);
        }
      } else if ((field->cpp_type() == FieldDescriptor::CPPTYPE_INT64 ||
                  field->cpp_type() == FieldDescriptor::CPPTYPE_UINT64) &&
                 item.is_string()) {
        int64_t number = 0;
        if (absl::SimpleAtoi(item.get<std::string>(), &number)) item = number;
      }
    };
    if (value.is_array()) {
      for (auto& item : value) fix(item);
    } else {
      fix(value);
    }
  }
}

bool NeedsQuotes(const std::string& text) {
  if (text.empty()) return true;
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "true" || lower == "false" || lower == "null" || lower == "~" || lower == "yes" ||
      lower == "no" || lower == "on" || lower == "off") {
    return true;
  }
  double number;
  if (absl::SimpleAtod(text, &number)) return true;
  if (std::string(":#&*!|>'\"%@`{}[],?-").find(text[0]) != std::string::npos) return true;
  return text.find(": ") != std::string::npos || text.find(" #") != std::string::npos ||
         text.back() == ' ' || text.front() == ' ' || text.back() == ':';
}

std::string Scalar(const nlohmann::json& value) {
  if (value.is_string()) {
    const std::string text = value.get<std::string>();
    return NeedsQuotes(text) ? value.dump() : text;
  }
  if (value.is_null()) return "null";
  return value.dump();
}

bool IsScalarList(const nlohmann::json& value) {
  if (!value.is_array()) return false;
  for (const auto& item : value) {
    if (item.is_object() || item.is_array()) return false;
  }
  return true;
}

// The keys of `object` in `schema`'s field order (keys it does not know last, sorted).
std::vector<std::string> OrderedKeys(const nlohmann::json& object, const Descriptor* schema) {
  std::vector<std::string> keys;
  if (schema != nullptr) {
    for (int i = 0; i < schema->field_count(); ++i) {
      if (object.contains(schema->field(i)->name())) keys.push_back(schema->field(i)->name());
    }
  }
  for (const auto& [key, value] : object.items()) {
    if (schema == nullptr || schema->FindFieldByName(key) == nullptr) keys.push_back(key);
  }
  return keys;
}

const Descriptor* ChildSchema(const Descriptor* schema, const std::string& key) {
  if (schema == nullptr) return nullptr;
  const FieldDescriptor* field = schema->FindFieldByName(key);
  return field != nullptr && field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE
             ? field->message_type()
             : nullptr;
}

void Emit(const nlohmann::json& object, const Descriptor* schema, const std::string& path,
          int indent, const std::function<std::string(const std::string&)>& comment,
          std::string* out) {
  const std::string pad(indent, ' ');
  for (const std::string& key : OrderedKeys(object, schema)) {
    const nlohmann::json& value = object[key];
    const std::string key_path = path.empty() ? key : path + "." + key;
    const std::string note = comment ? comment(key_path) : "";
    const std::string suffix = note.empty() ? "" : "  # " + note;
    if (value.is_object() && !value.empty()) {
      absl::StrAppend(out, pad, key, ":", suffix, "\n");
      Emit(value, ChildSchema(schema, key), key_path, indent + 2, comment, out);
    } else if (value.is_object()) {
      absl::StrAppend(out, pad, key, ": {}", suffix, "\n");
    } else if (IsScalarList(value)) {
      std::string items;
      for (const auto& item : value) absl::StrAppend(&items, items.empty() ? "" : ", ", Scalar(item));
      absl::StrAppend(out, pad, key, ": [", items, "]", suffix, "\n");
    } else if (value.is_array()) {
      absl::StrAppend(out, pad, key, ":", suffix, "\n");
      for (const auto& item : value) {
        absl::StrAppend(out, pad, "  -\n");
        if (item.is_object()) Emit(item, ChildSchema(schema, key), key_path, indent + 4, comment, out);
      }
    } else {
      absl::StrAppend(out, pad, key, ": ", Scalar(value), suffix, "\n");
    }
  }
}

}  // namespace

nlohmann::json SpecToDocument(const v1::JobSpec& spec) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(spec, &json, options);
  nlohmann::json document = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!document.is_object()) return nlohmann::json::object();
  Normalize(*v1::JobSpec::descriptor(), &document);
  // A deprecated field is read from stored jobs only.
  if (document.contains("roles") && document["roles"].contains("reference")) {
    document["roles"]["reference"].erase("micro_batch_size_per_gpu");
  }
  return document;
}

std::string ToYaml(const nlohmann::json& document,
                   const std::function<std::string(const std::string& path)>& comment) {
  std::string out;
  if (document.is_object()) Emit(document, v1::JobSpec::descriptor(), "", 0, comment, &out);
  return out;
}

}  // namespace rlhfd::config
