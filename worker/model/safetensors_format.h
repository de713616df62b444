// The safetensors file format without LibTorch: header parsing with every bound checked, and
// header writing. A file is <u64 little-endian header length N><N bytes of JSON header><data>;
// the header maps tensor names to {dtype, shape, data_offsets [begin, end)} relative to the data.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rlhfd::model {

enum class TensorDtype { kBool, kU8, kI8, kI16, kI32, kI64, kF16, kBF16, kF32, kF64 };

// "F32", "BF16", ...; false for names we do not handle.
bool ParseTensorDtype(absl::string_view name, TensorDtype* dtype);
absl::string_view TensorDtypeName(TensorDtype dtype);
size_t TensorDtypeSize(TensorDtype dtype);

struct TensorEntry {
  std::string name;
  TensorDtype dtype;
  std::vector<int64_t> shape;
  // Byte range [begin, end) within the data section.
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct SafetensorsHeader {
  // Sorted by name.
  std::vector<TensorEntry> tensors;
  std::map<std::string, std::string> metadata;
  // Offset of the data section from the start of the file.
  uint64_t data_offset = 0;
};

// Largest header we accept (the reference implementation's limit).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100 << 20;

// Parses and checks the header of a whole file's bytes: the length prefix within the file, valid
// JSON, known dtypes, non-negative shapes, byte spans equal to shape x dtype size, offsets inside
// the data section, and no two tensors overlapping. Errors are INVALID_ARGUMENT naming `source`
// and the tensor.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view file,
                                                         absl::string_view source);

// Serialises a header (offsets as given) with the length prefix, padded to 8 bytes as the
// reference writer does so the data section stays aligned.
std::string SerializeSafetensorsHeader(const std::vector<TensorEntry>& tensors,
                                       const std::map<std::string, std::string>& metadata);

}  // namespace rlhfd::model
