// Builds a Transformer from a Hugging Face model directory: config.json → module → weights.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "worker/model/transformer.h"

namespace rlhfd::model {

struct LoadOptions {
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
};

// Errors name the directory and what is wrong with it (config, files, tensors).
absl::StatusOr<Transformer> LoadModel(const std::string& dir, const LoadOptions& options);

}  // namespace rlhfd::model
