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

// RMSNorm weights stay float32 in a bf16 / fp16 model (Megatron's mixed-dtype norms): they are
// a few kilobytes, the norms compute in float32 anyway, and rounding them is a needless error on
// every token. LoadModel applies it; call it after converting a model built in place.
void KeepNormWeightsWide(Transformer& model);

// Errors name the directory and what is wrong with it (config, files, tensors).
absl::StatusOr<Transformer> LoadModel(const std::string& dir, const LoadOptions& options);

}  // namespace rlhfd::model
