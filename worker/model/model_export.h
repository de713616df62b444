// Exports a model as a Hugging Face directory: config.json (copied from the source model),
// model.safetensors with the current weights, and the tokenizer files, so transformers and vLLM
// load it as is.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "worker/model/transformer.h"

namespace rlhfd::model {

// `source_dir` supplies config.json and tokenizer files; weights come from `model` (in the
// dtype given, e.g. at::kBFloat16 for a bf16 export), with LoRA adapters merged.
absl::Status ExportHuggingFaceDirectory(Transformer& model, const std::string& source_dir,
                                        const std::string& out_dir, at::ScalarType dtype);

}  // namespace rlhfd::model
