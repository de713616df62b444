// Writes tensors as a safetensors file that Hugging Face transformers and vLLM load as is.
#pragma once

#include <ATen/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace rlhfd::model {

// The bytes of a safetensors file of `tensors`: in the given order, contiguous and
// little-endian, from any device.
absl::StatusOr<std::string> SafetensorsBytes(
    const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Writes SafetensorsBytes to `path`, replaced atomically: a reader never sees half of it.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace rlhfd::model
