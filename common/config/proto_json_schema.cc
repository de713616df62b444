// Schema walk over protobuf descriptors for config documents.
#include "absl/strings/string_view.h"
#include "common/config/proto_json_schema.h"

#include <google/protobuf/descriptor.pb.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/util/text.h"

namespace rlhfd::config {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;

// Bounds on what one config value may hold; a job's paths and names are far shorter.
constexpr size_t kMaxStringBytes = 4096;
constexpr size_t kMaxListItems = 1024;

// Spellings users bring from verl and PyTorch, per enum: dtype names, and verl's names of the KL
// estimators (kl_penalty / kl_loss_type).
struct EnumAlias {
  const char* enum_name;
  const char* alias;
  const char* name;
};
const EnumAlias kEnumAliases[] = {
    {"rlhfd.v1.DType", "bfloat16", "bf16"},         {"rlhfd.v1.DType", "float16", "fp16"},
    {"rlhfd.v1.DType", "half", "fp16"},             {"rlhfd.v1.DType", "float32", "fp32"},
    {"rlhfd.v1.DType", "float", "fp32"},            {"rlhfd.v1.KlEstimator", "kl", "k1"},
    {"rlhfd.v1.KlEstimator", "mse", "k2"},          {"rlhfd.v1.KlEstimator", "low_var_kl", "k3"},
};

// Fields kept in the schema for stored jobs but renamed in configs.
const std::pair<const char*, const char*> kRenamedFields[] = {
    {"rlhfd.v1.ReferenceSpec.micro_batch_size_per_gpu", "log_prob_micro_batch_size_per_gpu"},
};

// Fields where null means "at the default", as verl writes them (max_actor_ckpt_to_keep: null
// keeps every checkpoint): the key is dropped and the default applies.
const char* const kNullMeansDefault[] = {"rlhfd.v1.TrainerSpec.max_ckpt_to_keep",
                                         "rlhfd.v1.RolloutCorrectionSpec.rollout_is"};

// Keys are the user's text: shown sanitised and cut, so an error message stays one short line.
std::string JoinPath(absl::string_view parent, absl::string_view key) {
  const std::string shown = SanitizeForDisplay(key, 80);
  return parent.empty() ? shown : absl::StrCat(parent, ".", shown);
}

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string UnknownKeyMessage(absl::string_view key, const Descriptor& schema) {
  std::vector<std::string> names;
  std::string closest;
  size_t best = 3;  // Suggest only names within two edits.
  // A long key is no typo of a field name; and edit distances are quadratic.
  const bool suggest = key.size() <= 64;
  for (int i = 0; i < schema.field_count(); ++i) {
    const std::string& name = schema.field(i)->name();
    names.push_back(name);
    if (!suggest) continue;
    const std::string lower = absl::AsciiStrToLower(key);
    // A name that one is a prefix of ("trainer_config" for "trainer") counts as one edit away.
    const bool prefix = name.size() >= 3 && (absl::StartsWith(lower, name) ||
                                             absl::StartsWith(name, lower));
    size_t distance = prefix ? 1 : EditDistance(lower, name);
    if (distance < best) {
      best = distance;
      closest = name;
    }
  }
  std::string message = "unknown key";
  if (!closest.empty()) absl::StrAppend(&message, "; did you mean '", closest, "'?");
  absl::StrAppend(&message, " (valid keys here: ", absl::StrJoin(names, ", "), ")");
  return message;
}

// By proto name ("train_files") or JSON name ("trainFiles").
const FieldDescriptor* FindField(const Descriptor& schema, const std::string& key) {
  if (const FieldDescriptor* field = schema.FindFieldByName(key)) return field;
  for (int i = 0; i < schema.field_count(); ++i) {
    if (schema.field(i)->json_name() == key) return schema.field(i);
  }
  return nullptr;
}

// Never throws: bytes that are not UTF-8 are replaced rather than refused by the writer.
std::string Describe(const nlohmann::json& value) {
  return SanitizeForDisplay(
      value.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace), 60);
}

// A scalar as text: YAML scalars arrive as strings, JSON ones as numbers or booleans.
bool ScalarText(const nlohmann::json& value, std::string* text) {
  if (value.is_string()) {
    *text = value.get<std::string>();
    return true;
  }
  if (value.is_number() || value.is_boolean()) {
    *text = value.dump();
    return true;
  }
  return false;
}

class SchemaWalker {
 public:
  explicit SchemaWalker(ConfigErrors* errors) : errors_(errors) {}

  nlohmann::json Message(const nlohmann::json& object, const Descriptor& schema,
                         const std::string& path) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [key, value] : object.items()) {
      const std::string key_path = JoinPath(path, key);
      const FieldDescriptor* field = FindField(schema, key);
      if (field == nullptr) {
        errors_->Add(key_path, UnknownKeyMessage(key, schema));
        continue;
      }
      if (field->options().deprecated()) {
        std::string renamed = "a current key";
        for (const auto& [old_name, new_name] : kRenamedFields) {
          if (field->full_name() == old_name) renamed = absl::StrCat("'", new_name, "'");
        }
        errors_->Add(key_path, absl::StrCat("was renamed; use ", renamed));
        continue;
      }
      if (value.is_null() && field->type() != FieldDescriptor::TYPE_MESSAGE) {
        const bool means_default =
            std::find(std::begin(kNullMeansDefault), std::end(kNullMeansDefault),
                      field->full_name()) != std::end(kNullMeansDefault);
        if (!means_default) errors_->Add(key_path, "has no value; give one or remove the key");
        continue;
      }
      nlohmann::json normalized = Field(value, *field, key_path);
      if (!normalized.is_discarded()) out[field->name()] = std::move(normalized);
    }
    return out;
  }

 private:
  nlohmann::json Field(const nlohmann::json& value, const FieldDescriptor& field,
                       const std::string& path) {
    if (!field.is_repeated()) return Single(value, field, path);
    // A single value where a list is expected is read as a list of one (train_files: a.jsonl).
    const nlohmann::json items = value.is_array() ? value : nlohmann::json::array({value});
    if (items.size() > kMaxListItems) {
      errors_->Add(path, absl::StrCat("has ", items.size(), " items; at most ", kMaxListItems,
                                      " are accepted"));
      return nlohmann::json::value_t::discarded;
    }
    nlohmann::json out = nlohmann::json::array();
    for (size_t i = 0; i < items.size(); ++i) {
      nlohmann::json item = Single(items[i], field, absl::StrCat(path, "[", i, "]"));
      if (!item.is_discarded()) out.push_back(std::move(item));
    }
    return out;
  }

  // A free-form value: the config parser keeps every YAML scalar as text, so text that reads
  // as true/false or a number becomes one (as YAML's core schema reads a plain scalar).
  static nlohmann::json Free(const nlohmann::json& value) {
    if (value.is_object() || value.is_array()) {
      nlohmann::json out = value.is_object() ? nlohmann::json::object() : nlohmann::json::array();
      for (const auto& [key, item] : value.items()) {
        if (value.is_object()) {
          out[key] = Free(item);
        } else {
          out.push_back(Free(item));
        }
      }
      return out;
    }
    if (!value.is_string()) return value;
    const std::string& text = value.get_ref<const std::string&>();
    const std::string lower = absl::AsciiStrToLower(text);
    if (lower == "true") return true;
    if (lower == "false") return false;
    int64_t integer = 0;
    if (absl::SimpleAtoi(text, &integer)) return integer;
    double number = 0;
    if (absl::SimpleAtod(text, &number) && std::isfinite(number) &&
        text.find_first_of("0123456789") != std::string::npos) {
      return number;
    }
    return value;
  }

  nlohmann::json Single(const nlohmann::json& value, const FieldDescriptor& field,
                        const std::string& path) {
    const nlohmann::json discarded = nlohmann::json::value_t::discarded;
    std::string text;
    switch (field.cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (value.is_null()) return nlohmann::json::object();  // "critic:" with nothing under it
        if (!value.is_object()) {
          errors_->Add(path, absl::StrCat("expected a mapping of keys, got ", Describe(value)));
          return discarded;
        }
        // Free-form keys (custom_reward_function.reward_kwargs): passed on as written, within
        // the document's own bounds, with YAML's plain scalars typed.
        if (field.message_type()->full_name() == "google.protobuf.Struct") return Free(value);
        return Message(value, *field.message_type(), path);
      case FieldDescriptor::CPPTYPE_STRING:
        if (!ScalarText(value, &text)) {
          errors_->Add(path, absl::StrCat("expected a string, got ", Describe(value)));
          return discarded;
        }
        return String(std::move(text), path);
      case FieldDescriptor::CPPTYPE_BOOL: {
        if (value.is_boolean()) return value;
        if (ScalarText(value, &text)) {
          std::string lower = absl::AsciiStrToLower(text);
          if (lower == "true") return true;
          if (lower == "false") return false;
        }
        errors_->Add(path, absl::StrCat("expected true or false, got ", Describe(value)));
        return discarded;
      }
      case FieldDescriptor::CPPTYPE_INT32:
      case FieldDescriptor::CPPTYPE_INT64:
      case FieldDescriptor::CPPTYPE_UINT32:
      case FieldDescriptor::CPPTYPE_UINT64:
        return Integer(value, field, path);
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT: {
        double number = 0;
        const bool parsed =
            value.is_number()
                ? (number = value.get<double>(), true)
                : value.is_string() && absl::SimpleAtod(value.get<std::string>(), &number);
        if (!parsed) {
          errors_->Add(path, absl::StrCat("expected a number, got ", Describe(value)));
          return discarded;
        }
        const double limit = field.cpp_type() == FieldDescriptor::CPPTYPE_FLOAT
                                 ? std::numeric_limits<float>::max()
                                 : std::numeric_limits<double>::max();
        if (!std::isfinite(number) || std::fabs(number) > limit) {
          errors_->Add(path, absl::StrCat(Describe(value), " is not a finite number"));
          return discarded;
        }
        return number;
      }
      case FieldDescriptor::CPPTYPE_ENUM:
        return Enum(value, *field.enum_type(), path);
    }
    errors_->Add(path, "unsupported field type");
    return discarded;
  }

  nlohmann::json Integer(const nlohmann::json& value, const FieldDescriptor& field,
                         const std::string& path) {
    int64_t number = 0;
    bool parsed = false;
    bool too_large = false;
    if (value.is_number_unsigned()) {
      // get<int64_t> would wrap values past int64 around to negative numbers.
      const uint64_t unsigned_number = value.get<uint64_t>();
      too_large = unsigned_number > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
      number = static_cast<int64_t>(unsigned_number);
      parsed = !too_large;
    } else if (value.is_number_integer()) {
      number = value.get<int64_t>();
      parsed = true;
    } else if (value.is_number_float()) {
      double d = value.get<double>();
      parsed = std::floor(d) == d && std::fabs(d) < 9e18;
      too_large = std::floor(d) == d && !parsed;
      if (parsed) number = static_cast<int64_t>(d);
    } else if (value.is_string()) {
      parsed = absl::SimpleAtoi(value.get<std::string>(), &number);
      double d = 0;
      too_large = !parsed && absl::SimpleAtod(value.get<std::string>(), &d) &&
                  std::floor(d) == d && std::fabs(d) >= 9e18;
    }
    if (too_large) {
      errors_->Add(path, absl::StrCat(Describe(value), " is out of range"));
      return nlohmann::json::value_t::discarded;
    }
    if (!parsed) {
      errors_->Add(path, absl::StrCat("expected a whole number, got ", Describe(value)));
      return nlohmann::json::value_t::discarded;
    }
    int64_t low = std::numeric_limits<int64_t>::min(), high = std::numeric_limits<int64_t>::max();
    if (field.cpp_type() == FieldDescriptor::CPPTYPE_INT32) {
      low = std::numeric_limits<int32_t>::min();
      high = std::numeric_limits<int32_t>::max();
    } else if (field.cpp_type() == FieldDescriptor::CPPTYPE_UINT32) {
      low = 0;
      high = std::numeric_limits<uint32_t>::max();
    } else if (field.cpp_type() == FieldDescriptor::CPPTYPE_UINT64) {
      low = 0;
    }
    if (number < low || number > high) {
      errors_->Add(path, absl::StrCat(number, " is out of range [", low, ", ", high, "]"));
      return nlohmann::json::value_t::discarded;
    }
    return number;
  }

  nlohmann::json String(std::string text, const std::string& path) {
    if (text.size() > kMaxStringBytes) {
      errors_->Add(path, absl::StrCat("is ", text.size(), " bytes long; at most ", kMaxStringBytes,
                                      " are accepted"));
      return nlohmann::json::value_t::discarded;
    }
    if (!IsValidUtf8(text)) {
      errors_->Add(path, "is not valid UTF-8");
      return nlohmann::json::value_t::discarded;
    }
    if (const int control = FirstControlCharacter(text); control >= 0) {
      errors_->Add(path, absl::StrFormat("contains the control character U+%04X; remove it",
                                         control));
      return nlohmann::json::value_t::discarded;
    }
    return text;
  }

  nlohmann::json Enum(const nlohmann::json& value, const EnumDescriptor& type,
                      const std::string& path) {
    std::string text;
    if (ScalarText(value, &text)) {
      std::string wanted = absl::StrReplaceAll(absl::AsciiStrToLower(text), {{"-", "_"}});
      for (const EnumAlias& alias : kEnumAliases) {
        if (type.full_name() == alias.enum_name && wanted == alias.alias) wanted = alias.name;
      }
      for (int i = 0; i < type.value_count(); ++i) {
        const auto* candidate = type.value(i);
        // Full names (ADVANTAGE_ESTIMATOR_GRPO) come from programs that print JobSpec as JSON.
        const std::string short_name =
            absl::StrReplaceAll(EnumConfigName(*candidate), {{"-", "_"}});
        if (candidate->number() != 0 && (short_name == wanted ||
                                         absl::AsciiStrToLower(candidate->name()) == wanted)) {
          return candidate->name();
        }
      }
    }
    std::vector<std::string> valid;
    for (int i = 0; i < type.value_count(); ++i) {
      if (type.value(i)->number() != 0) valid.push_back(EnumConfigName(*type.value(i)));
    }
    errors_->Add(path, absl::StrCat(Describe(value), " is not one of: ", absl::StrJoin(valid, ", ")));
    return nlohmann::json::value_t::discarded;
  }

  ConfigErrors* errors_;
};

}  // namespace

std::string EnumConfigName(const google::protobuf::EnumValueDescriptor& value) {
  // Every enum's zero value is <PREFIX>_UNSPECIFIED (proto style); the prefix is dropped.
  const std::string& zero = value.type()->value(0)->name();
  const std::string prefix = zero.substr(0, zero.rfind("UNSPECIFIED"));
  std::string name = value.name();
  if (!prefix.empty() && name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  name = absl::AsciiStrToLower(name);
  // verl writes loss aggregation modes with hyphens (token-mean); '-' and '_' both parse.
  if (value.type()->full_name() == "rlhfd.v1.LossAggregation") {
    name = absl::StrReplaceAll(name, {{"_", "-"}});
  }
  return name;
}

nlohmann::json NormalizeToSchema(const nlohmann::json& document,
                                 const google::protobuf::Descriptor& schema, ConfigErrors* errors) {
  return SchemaWalker(errors).Message(document, schema, "");
}

}  // namespace rlhfd::config
