// LoRA adapters on a Transformer, in PEFT's layout and numbers: each adapted linear layer gets
// children lora_A (rank, in) and lora_B (out, rank), so its parameters are named as PEFT names them
// ("model.layers.0.self_attn.q_proj.lora_A.weight"), and computes x W^T + b + scaling (x A^T) B^T
// with scaling = alpha / rank (alpha / sqrt(rank) with rsLoRA). Adapters train in float32; every
// other parameter is frozen. docs/internals/lora.md.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model/transformer.h"

namespace rlhfd::model {

struct LoraOptions {
  int64_t rank = 0;
  double alpha = 16;
  bool rslora = false;              // PEFT's use_rslora
  std::vector<std::string> layers;  // from models::kLoraLayers
  double scaling() const;
};

// Whether `name` is an adapter's parameter (…lora_A.weight, …lora_B.weight).
bool IsLoraParameter(const std::string& name);

// Adds an adapter to each of `options.layers` in every decoder layer, as PEFT's default init
// makes it: lora_A drawn from kaiming-uniform (a = sqrt(5): U(-1/sqrt(in), 1/sqrt(in))) with
// `seed`, lora_B zero, so the model computes what it did. Adapters are float32 (float64 stays) on
// the model's device; every other parameter stops requiring gradients. FAILED_PRECONDITION when
// the model has adapters already; INVALID_ARGUMENT for a rank below 1 or an unknown layer.
absl::Status AddLoraAdapters(Transformer& model, const LoraOptions& options, uint64_t seed);

// Whether AddLoraAdapters gave the model adapters.
bool HasLoraAdapters(Transformer& model);

// The parameters that train: the adapters when the model has them, else every parameter.
std::vector<at::Tensor> TrainableParameters(Transformer& model);

// The weights a model without adapters has, by its names and in its order: each adapted layer's
// weight merged, W + scaling (B A) (PEFT's merge_and_unload), in W's dtype; every other parameter
// as it is (the same tensor). A model without adapters gives its parameters.
std::vector<std::pair<std::string, at::Tensor>> MergedParameters(Transformer& model);

// Runs the model without its adapters (the base model, as the reference sees it) while alive.
class AdaptersOff {
 public:
  explicit AdaptersOff(Transformer& model);
  ~AdaptersOff();
  AdaptersOff(const AdaptersOff&) = delete;
  AdaptersOff& operator=(const AdaptersOff&) = delete;

 private:
  Transformer model_;
  bool was_enabled_;
};

// A PEFT adapter directory: adapter_config.json and adapter_model.safetensors.
// Its rank, alpha, rsLoRA and layers. INVALID_ARGUMENT, naming the file and key, for what rlhfd
// cannot run the same way: another peft_type, DoRA, biases, per-module rank or alpha patterns,
// modules_to_save, layers_to_transform, or target modules outside models::kLoraLayers.
absl::StatusOr<LoraOptions> ReadPeftAdapterConfig(const std::string& dir);
// Copies the directory's adapters into `model`'s, which must have the same layers and rank:
// every adapter tensor present, none unknown, shapes equal (errors name the tensors).
absl::Status LoadPeftAdapter(Transformer& model, const std::string& dir);
// Writes the model's adapters as a PEFT directory that peft.PeftModel.from_pretrained loads over
// `base_model` (recorded as base_model_name_or_path).
absl::Status WritePeftAdapter(Transformer& model, const LoraOptions& options,
                              const std::string& base_model, const std::string& dir);

}  // namespace rlhfd::model
