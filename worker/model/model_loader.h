// Builds a Transformer from a Hugging Face model directory: config.json → module → weights.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "worker/model/transformer.h"

namespace rlhfd::model {

// Which head a caller needs: an actor or reference scores tokens (causal LM), a critic or reward
// model has a score head.
enum class HeadNeed { kAny, kCausalLm, kScore };

struct LoadOptions {
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  HeadNeed head = HeadNeed::kAny;
  // The longest sequence (prompt + response tokens) the caller will run; a sliding-window model
  // is accepted when it fits in the window. 0: unknown, so a sliding-window model is refused;
  // kNoForward: the model is only read and written (export), never run.
  static constexpr int64_t kNoForward = -1;
  int64_t max_sequence_length = 0;
  // Names that length in the refusal ("max_prompt_length + max_response_length").
  std::string sequence_what = "the sequences";
  // With head kScore, a causal-LM directory is loaded as a value model, as verl makes a critic
  // from the actor's weights: its decoder, no LM head, and a new one-label score head drawn from
  // N(0, initializer_range) with this seed.
  bool fresh_score_head = false;
  uint64_t seed = 1;
};

// RMSNorm weights stay float32 in a bf16 / fp16 model (Megatron's mixed-dtype norms): they are
// a few kilobytes, the norms compute in float32 anyway, and rounding them is a needless error on
// every token. LoadModel applies it; call it after converting a model built in place.
void KeepNormWeightsWide(Transformer& model);

// Errors name the directory and what is wrong with it (config, files, tensors, the head, a
// model too large for the device). Never throws.
absl::StatusOr<Transformer> LoadModel(const std::string& dir, const LoadOptions& options);

}  // namespace rlhfd::model
