// StateDict over mapped safetensors files.
#include "worker/model/state_dict.h"

#include <ATen/ops/from_blob.h>

#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status/status_macros.h"
#include "common/util/files.h"

namespace rlhfd::model {

at::ScalarType ToScalarType(TensorDtype dtype) {
  switch (dtype) {
    case TensorDtype::kBool: return at::kBool;
    case TensorDtype::kU8: return at::kByte;
    case TensorDtype::kI8: return at::kChar;
    case TensorDtype::kI16: return at::kShort;
    case TensorDtype::kI32: return at::kInt;
    case TensorDtype::kI64: return at::kLong;
    case TensorDtype::kF16: return at::kHalf;
    case TensorDtype::kBF16: return at::kBFloat16;
    case TensorDtype::kF32: return at::kFloat;
    case TensorDtype::kF64: return at::kDouble;
  }
  return at::kFloat;
}

std::string ShapeString(at::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status TensorMismatch(const std::string& header, const std::vector<std::string>& missing,
                            const std::vector<std::string>& unexpected,
                            const std::vector<std::string>& wrong_shape) {
  if (missing.empty() && unexpected.empty() && wrong_shape.empty()) return absl::OkStatus();
  std::string message = header;
  if (!missing.empty()) absl::StrAppend(&message, "\n  missing: ", absl::StrJoin(missing, ", "));
  if (!unexpected.empty()) {
    absl::StrAppend(&message, "\n  unexpected: ", absl::StrJoin(unexpected, ", "));
  }
  if (!wrong_shape.empty()) {
    absl::StrAppend(&message, "\n  wrong shape: ", absl::StrJoin(wrong_shape, ", "));
  }
  return absl::InvalidArgumentError(message);
}

absl::Status StateDict::AddFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::shared_ptr<MappedFile> file, MappedFile::Open(path));
  ASSIGN_OR_RETURN(SafetensorsHeader header, ParseSafetensorsHeader(file->bytes(), path));
  for (TensorEntry& tensor : header.tensors) {
    const std::string name = tensor.name;
    auto [it, inserted] = entries_.emplace(name, Entry{file, header.data_offset, std::move(tensor)});
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' appears in both ",
                                                     it->second.file->path(), " and ", path));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StateDict> StateDict::Load(const std::string& path) {
  StateDict dict;
  dict.source_ = path;
  if (!IsDirectory(path)) {
    RETURN_IF_ERROR(dict.AddFile(path));
    return dict;
  }
  const std::string index_path = path + "/model.safetensors.index.json";
  if (PathExists(index_path)) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path));
    const nlohmann::json index = nlohmann::json::parse(text, nullptr, false);
    if (index.is_discarded() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": expected a JSON object with a weight_map"));
    }
    std::set<std::string> shards;
    for (const auto& [name, shard] : index["weight_map"].items()) {
      if (!shard.is_string() || shard.get<std::string>().find('/') != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": weight_map entry for '", name, "' is not a file name"));
      }
      shards.insert(shard.get<std::string>());
    }
    for (const std::string& shard : shards) RETURN_IF_ERROR(dict.AddFile(path + "/" + shard));
    // Every tensor the index lists must be in the shard it names.
    for (const auto& [name, shard] : index["weight_map"].items()) {
      auto it = dict.entries_.find(name);
      if (it == dict.entries_.end() ||
          !absl::EndsWith(it->second.file->path(), "/" + shard.get<std::string>())) {
        return absl::InvalidArgumentError(absl::StrCat(index_path, ": '", name, "' is not in ",
                                                       shard.get<std::string>()));
      }
    }
    return dict;
  }
  const std::string single = path + "/model.safetensors";
  if (!PathExists(single)) {
    return absl::NotFoundError(absl::StrCat(path, " has neither model.safetensors nor "
                                                  "model.safetensors.index.json"));
  }
  RETURN_IF_ERROR(dict.AddFile(single));
  return dict;
}

std::vector<std::string> StateDict::names() const {
  std::vector<std::string> out;
  for (const auto& [name, entry] : entries_) out.push_back(name);
  return out;
}

absl::StatusOr<at::Tensor> StateDict::Get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("no tensor '", name, "' in ", source_));
  }
  const Entry& entry = it->second;
  const char* data = entry.file->bytes().data() + entry.data_offset + entry.tensor.begin;
  const at::ScalarType type = ToScalarType(entry.tensor.dtype);
  if (entry.tensor.end == entry.tensor.begin) {
    return at::empty(entry.tensor.shape, at::TensorOptions().dtype(type));
  }
  std::shared_ptr<MappedFile> keep_alive = entry.file;
  // The mapping is read-only; callers copy (to a dtype or device) before writing.
  return at::from_blob(const_cast<char*>(data), entry.tensor.shape,
                       [keep_alive](void*) mutable { keep_alive.reset(); },
                       at::TensorOptions().dtype(type));
}

absl::StatusOr<at::Tensor> StateDict::Sharded(const std::string& name, int64_t dim, int64_t rank,
                                              int64_t world) const {
  ASSIGN_OR_RETURN(at::Tensor full, Get(name));
  if (dim < 0 || dim >= full.dim() || full.size(dim) % world != 0 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(absl::StrCat("cannot split '", name, "' of shape ",
                                                   ShapeString(full.sizes()), " into ", world,
                                                   " parts along dim ", dim));
  }
  const int64_t part = full.size(dim) / world;
  return full.narrow(dim, rank * part, part);
}

StateDict StateDict::Select(const std::string& prefix) const {
  StateDict out;
  out.source_ = source_;
  for (const auto& [name, entry] : entries_) {
    if (absl::StartsWith(name, prefix)) out.entries_.emplace(name.substr(prefix.size()), entry);
  }
  return out;
}

}  // namespace rlhfd::model
