// libFuzzer target: any bytes as a safetensors file must parse or be refused, never crash, and
// a parsed header must describe only bytes inside the file.
#include <cstddef>
#include <cstdint>

#include "worker/model/safetensors_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view file(reinterpret_cast<const char*>(data), size);
  auto header = rlhfd::model::ParseSafetensorsHeader(file, "fuzz");
  if (header.ok()) {
    for (const auto& tensor : header->tensors) {
      if (header->data_offset + tensor.end > size || tensor.begin > tensor.end) __builtin_trap();
    }
  }
  return 0;
}
