// Random-weight decoders in the shapes the fused GPU decode serves, for the GPU tests: the same
// weights in every process (a fixed seed, drawn on the CPU), so ranks of a multi-process test
// hold one model.
#pragma once

#include <ATen/ATen.h>
#include <torch/types.h>

#include <string>

#include "worker/model/model_loader.h"
#include "worker/model/transformer.h"

namespace rlhfd::testing {

// Qwen2-like (q/k/v bias, head dim 64, tied embeddings) or Qwen3-like (q/k RMSNorm, head dim
// 128, an untied head); vocabulary 2,048, MLP 1,024, 3 layers. Weights ~ N(0, 0.05), norms
// ~ N(1, 0.1), in bf16 on `device` with the norms kept float32 as loaded models keep them.
inline model::Transformer RandomDecoder(bool qwen3, int64_t hidden, int64_t heads, int64_t kv_heads,
                                        const at::Device& device) {
  model::ModelConfig c;
  c.architecture = qwen3 ? "Qwen3ForCausalLM" : "Qwen2ForCausalLM";
  c.family = qwen3 ? model::ModelFamily::kQwen3 : model::ModelFamily::kQwen2;
  c.attention_bias = !qwen3;
  c.qk_norm = qwen3;
  c.vocab_size = 2048;
  c.hidden_size = hidden;
  c.intermediate_size = 1024;
  c.num_layers = 3;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = qwen3 ? 128 : 64;
  c.max_position_embeddings = 2048;
  c.tie_word_embeddings = !qwen3;
  at::manual_seed(3);
  model::Transformer model(c);
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) p.normal_(0, 0.05);
  for (auto& item : model->named_parameters()) {
    if (item.key().find("norm") != std::string::npos) item.value().normal_(1.0, 0.1);
  }
  model->to(device, at::kBFloat16);
  model::KeepNormWeightsWide(model);  // As loaded models are (values already bf16-exact).
  return model;
}

}  // namespace rlhfd::testing
