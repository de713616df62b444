// Writes tensors as a safetensors file that Hugging Face transformers and vLLM load as is.
#pragma once

#include <ATen/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace rlhfd::model {

// Tensors are written in the given order, contiguous and little-endian, from any device. The
// file is replaced atomically: a reader never sees half of it.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace rlhfd::model
