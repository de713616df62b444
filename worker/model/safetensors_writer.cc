// safetensors writing on top of the header serialiser and the atomic file writer.
#include "worker/model/safetensors_writer.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "common/util/files.h"
#include "worker/model/safetensors_format.h"

namespace rlhfd::model {
namespace {

bool ToTensorDtype(at::ScalarType type, TensorDtype* dtype) {
  switch (type) {
    case at::kBool: *dtype = TensorDtype::kBool; return true;
    case at::kByte: *dtype = TensorDtype::kU8; return true;
    case at::kChar: *dtype = TensorDtype::kI8; return true;
    case at::kShort: *dtype = TensorDtype::kI16; return true;
    case at::kInt: *dtype = TensorDtype::kI32; return true;
    case at::kLong: *dtype = TensorDtype::kI64; return true;
    case at::kHalf: *dtype = TensorDtype::kF16; return true;
    case at::kBFloat16: *dtype = TensorDtype::kBF16; return true;
    case at::kFloat: *dtype = TensorDtype::kF32; return true;
    case at::kDouble: *dtype = TensorDtype::kF64; return true;
    default: return false;
  }
}

}  // namespace

absl::StatusOr<std::string> SafetensorsBytes(
    const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    const std::map<std::string, std::string>& metadata) {
  std::vector<TensorEntry> entries;
  std::vector<at::Tensor> contiguous;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    TensorEntry entry;
    entry.name = name;
    if (!ToTensorDtype(tensor.scalar_type(), &entry.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "' has a dtype safetensors cannot hold"));
    }
    at::Tensor cpu = tensor.detach().to(at::kCPU).contiguous();
    entry.shape = cpu.sizes().vec();
    entry.begin = offset;
    offset += cpu.numel() * cpu.element_size();
    entry.end = offset;
    entries.push_back(std::move(entry));
    contiguous.push_back(std::move(cpu));
  }
  std::string file = SerializeSafetensorsHeader(entries, metadata);
  file.reserve(file.size() + offset);
  for (const at::Tensor& tensor : contiguous) {
    file.append(static_cast<const char*>(tensor.data_ptr()), tensor.numel() * tensor.element_size());
  }
  return file;
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::string> file = SafetensorsBytes(tensors, metadata);
  if (!file.ok()) return file.status();
  return WriteFileAtomically(path, *file);
}

}  // namespace rlhfd::model
