// StateDict: the tensors of a Hugging Face checkpoint (one safetensors file, or shards listed in
// model.safetensors.index.json), memory-mapped and handed out as zero-copy CPU tensors, with the
// selection and tensor-parallel slicing that loading and resharding need.
#pragma once

#include <ATen/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/mapped_file.h"
#include "worker/model/safetensors_format.h"

namespace rlhfd::model {

class StateDict {
 public:
  // A directory (model.safetensors or model.safetensors.index.json) or one .safetensors file.
  static absl::StatusOr<StateDict> Load(const std::string& path);

  // Names in sorted order.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const { return entries_.count(name) > 0; }
  size_t size() const { return entries_.size(); }

  // A CPU tensor viewing the mapped bytes (valid while this StateDict or a copy lives; the
  // tensor keeps the mapping alive). NOT_FOUND names the tensor and the file(s) searched.
  absl::StatusOr<at::Tensor> Get(const std::string& name) const;

  // Slice `rank` of `world` equal parts along `dim` (tensor-parallel loading).
  absl::StatusOr<at::Tensor> Sharded(const std::string& name, int64_t dim, int64_t rank,
                                     int64_t world) const;

  // The tensors whose names start with `prefix`, with the prefix removed.
  StateDict Select(const std::string& prefix) const;

 private:
  struct Entry {
    std::shared_ptr<MappedFile> file;
    uint64_t data_offset;
    TensorEntry tensor;
  };
  absl::Status AddFile(const std::string& path);

  std::string source_;
  std::map<std::string, Entry> entries_;
};

at::ScalarType ToScalarType(TensorDtype dtype);

// "[64, 160]" for error messages.
std::string ShapeString(at::IntArrayRef shape);

// INVALID_ARGUMENT for tensors that do not fill what they should: `header`, then a line each for
// the missing, unexpected and wrong-shaped names that there are. OK when all three are empty.
absl::Status TensorMismatch(const std::string& header, const std::vector<std::string>& missing,
                            const std::vector<std::string>& unexpected,
                            const std::vector<std::string>& wrong_shape);

}  // namespace rlhfd::model
