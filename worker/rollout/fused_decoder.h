// The decode step on a CUDA GPU in bf16, fused: one GEMM for q/k/v, one for gate/up, and our
// kernels for residual + RMSNorm, rotary + cache append, attention and SiLU-gating, about nine
// kernels per layer where the module forward launches over forty. At decode batch sizes the step
// is bound by kernel count, not FLOPs.
//
// Holds rollout-layout copies of the q/k/v and gate/up weights (concatenated), made from the
// model's parameters when built; rebuild it after the weights change.
#pragma once

#include <ATen/Tensor.h>

#include <functional>
#include <vector>

#include "worker/model/transformer.h"
#include "worker/rollout/slot_kv_cache.h"

namespace rlhfd::rollout {

class FusedDecoder {
 public:
  // CUDA, bf16 weights, head dim 64 or 128, at most 8 query heads per key/value head.
  static bool Supports(const model::Transformer& model);
  explicit FusedDecoder(model::Transformer& model);

  // tokens, positions, slots (B) int64 on the device → next-token logits (B, V) float32. Writes
  // each row's key and value into `cache`.
  at::Tensor Decode(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& slots,
                    SlotKvCache& cache);
  // Whole prompts: ids (B, T) right-padded, lengths (B) and slots (B) int64 on the device. Writes
  // the prompts' keys and values to positions [0, length) of their slots (padding to
  // `scratch_slot`) and returns the logits after each prompt's last token (B, V) float32.
  at::Tensor Prefill(const at::Tensor& ids, const at::Tensor& lengths, const at::Tensor& slots,
                     int64_t scratch_slot, SlotKvCache& cache);

 private:
  struct Layer {
    at::Tensor input_norm, post_norm, q_norm, k_norm;  // q_norm/k_norm: Qwen3 only.
    at::Tensor qkv_weight, qkv_bias;                   // (H + 2K) * D rows; bias optional.
    at::Tensor o_weight, o_bias;
    at::Tensor gate_up_weight, gate_up_bias;  // 2F rows.
    at::Tensor down_weight, down_bias;
  };
  // attend(layer, q (N, H, D), k (N, K, D) or undefined, qkv (N, (H + 2K) D)) → (N, H D).
  using AttendFn =
      std::function<at::Tensor(size_t, const at::Tensor&, const at::Tensor&, const at::Tensor&)>;
  // Embedding, every layer (keys and values into `cache`) and the final norm over N tokens; keeps
  // the rotated keys for `attend` when asked. Returns (N, C) bf16.
  at::Tensor Layers(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& slots,
                    SlotKvCache& cache, bool keep_keys, const AttendFn& attend);

  model::ModelConfig config_;
  at::Tensor embed_, final_norm_, head_, inv_freq_;
  std::vector<Layer> layers_;
};

}  // namespace rlhfd::rollout
