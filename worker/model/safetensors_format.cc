// safetensors header parsing and writing; see safetensors_format.h.
#include "worker/model/safetensors_format.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace rlhfd::model {
namespace {

struct DtypeInfo {
  TensorDtype dtype;
  const char* name;
  size_t size;
};

constexpr DtypeInfo kDtypes[] = {
    {TensorDtype::kBool, "BOOL", 1}, {TensorDtype::kU8, "U8", 1},     {TensorDtype::kI8, "I8", 1},
    {TensorDtype::kI16, "I16", 2},   {TensorDtype::kI32, "I32", 4},   {TensorDtype::kI64, "I64", 8},
    {TensorDtype::kF16, "F16", 2},   {TensorDtype::kBF16, "BF16", 2}, {TensorDtype::kF32, "F32", 4},
    {TensorDtype::kF64, "F64", 8}};

absl::Status Invalid(absl::string_view source, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": not a valid safetensors file: ", what));
}

}  // namespace

bool ParseTensorDtype(absl::string_view name, TensorDtype* dtype) {
  for (const DtypeInfo& info : kDtypes) {
    if (name == info.name) {
      *dtype = info.dtype;
      return true;
    }
  }
  return false;
}

absl::string_view TensorDtypeName(TensorDtype dtype) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.dtype == dtype) return info.name;
  }
  return "?";
}

size_t TensorDtypeSize(TensorDtype dtype) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.dtype == dtype) return info.size;
  }
  return 0;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view file,
                                                         absl::string_view source) {
  if (file.size() < 8) {
    return Invalid(source, absl::StrCat("only ", file.size(), " bytes; truncated?"));
  }
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<uint8_t>(file[i]);
  if (header_size > kMaxSafetensorsHeaderBytes) {
    return Invalid(source, absl::StrCat("header length ", header_size, " exceeds the ",
                                        kMaxSafetensorsHeaderBytes, "-byte limit"));
  }
  if (header_size > file.size() - 8) {
    return Invalid(source, absl::StrCat("header length ", header_size, " runs past the end of the ",
                                        file.size(), "-byte file; truncated?"));
  }
  const nlohmann::json header = nlohmann::json::parse(file.substr(8, header_size), nullptr,
                                                      /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Invalid(source, "the header is not a JSON object");
  }

  SafetensorsHeader parsed;
  parsed.data_offset = 8 + header_size;
  const uint64_t data_size = file.size() - parsed.data_offset;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) return Invalid(source, "__metadata__ is not an object");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) {
          return Invalid(source, absl::StrCat("__metadata__ value of '", key, "' is not a string"));
        }
        parsed.metadata[key] = text.get<std::string>();
      }
      continue;
    }
    const std::string where = absl::StrCat("tensor '", name, "'");
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
        !value.contains("data_offsets")) {
      return Invalid(source, absl::StrCat(where, " needs dtype, shape and data_offsets"));
    }
    TensorEntry entry;
    entry.name = name;
    const auto& dtype = value["dtype"];
    if (!dtype.is_string() || !ParseTensorDtype(dtype.get<std::string>(), &entry.dtype)) {
      return Invalid(source, absl::StrCat(where, " has unsupported dtype ", dtype.dump(),
                                          " (supported: BOOL, U8, I8, I16, I32, I64, F16, BF16, "
                                          "F32, F64)"));
    }
    const auto& shape = value["shape"];
    if (!shape.is_array() || shape.size() > 16) {
      return Invalid(source, absl::StrCat(where, " has a malformed shape"));
    }
    // Elements, checked for overflow as the shape is multiplied out.
    uint64_t elements = 1;
    for (const auto& dim : shape) {
      if (!dim.is_number_unsigned()) {
        return Invalid(source, absl::StrCat(where, " has a negative or non-integer dimension"));
      }
      const uint64_t d = dim.get<uint64_t>();
      if (d != 0 && elements > std::numeric_limits<uint64_t>::max() / 16 / d) {
        return Invalid(source, absl::StrCat(where, " has a shape too large to address"));
      }
      elements *= d;
      entry.shape.push_back(static_cast<int64_t>(d));
    }
    const auto& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      return Invalid(source, absl::StrCat(where, " has malformed data_offsets"));
    }
    entry.begin = offsets[0].get<uint64_t>();
    entry.end = offsets[1].get<uint64_t>();
    if (entry.begin > entry.end || entry.end > data_size) {
      return Invalid(source, absl::StrCat(where, " has data_offsets [", entry.begin, ", ", entry.end,
                                          ") outside the ", data_size, "-byte data section"));
    }
    const uint64_t expected = elements * TensorDtypeSize(entry.dtype);
    if (entry.end - entry.begin != expected) {
      return Invalid(source, absl::StrCat(where, " spans ", entry.end - entry.begin,
                                          " bytes but shape x dtype needs ", expected));
    }
    parsed.tensors.push_back(std::move(entry));
  }

  // No two tensors may share bytes.
  std::vector<const TensorEntry*> by_offset;
  for (const TensorEntry& entry : parsed.tensors) by_offset.push_back(&entry);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return a->begin < b->begin || (a->begin == b->begin && a->end < b->end);
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return Invalid(source, absl::StrCat("tensors '", by_offset[i - 1]->name, "' and '",
                                          by_offset[i]->name, "' overlap"));
    }
  }
  std::sort(parsed.tensors.begin(), parsed.tensors.end(),
            [](const TensorEntry& a, const TensorEntry& b) { return a.name < b.name; });
  return parsed;
}

std::string SerializeSafetensorsHeader(const std::vector<TensorEntry>& tensors,
                                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const TensorEntry& entry : tensors) {
    header[entry.name] = {{"dtype", std::string(TensorDtypeName(entry.dtype))},
                          {"shape", entry.shape},
                          {"data_offsets", {entry.begin, entry.end}}};
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t size = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((size >> (8 * i)) & 0xff);
  return out + json;
}

}  // namespace rlhfd::model
