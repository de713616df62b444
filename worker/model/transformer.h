// Decoder-only transformer of the Llama / Mistral / Qwen2 / Qwen3 family in LibTorch, with
// parameter names equal to Hugging Face's so checkpoints load by name.
//
// Shapes: B = batch, T = new tokens per sequence, S = keys attended (cache + new), C = hidden,
// H = query heads, K = key/value heads, D = head dim, F = MLP width, V = vocab, L = score labels.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "worker/model/model_config.h"

namespace torch::autograd {
struct AutogradContext;
}  // namespace torch::autograd

namespace rlhfd::model {

class StateDict;

// Where attention keeps keys and values across forward passes (incremental decoding). The model
// hands every layer's new keys/values to the cache, which stores them and attends over what it
// holds.
class AttentionCache {
 public:
  virtual ~AttentionCache() = default;
  // Positions already cached ahead of this forward's tokens, the same for every sequence; a cache
  // that tracks a length per sequence returns 0 and its caller passes explicit position ids.
  virtual int64_t past_length() const = 0;
  // q (B, H, T, D) and k/v (B, K, T, D) of the new tokens, rotated; `mask` as in AttentionContext.
  // Returns the attention output (B, H, T, D).
  virtual at::Tensor Attend(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& mask) = 0;
  // Called after every layer has run over `tokens` new positions.
  virtual void Advance(int64_t tokens) = 0;
};

// Softmax attention of q (B, H, T, D) over k/v (B, K, S, D) with grouped-query heads: causal when
// `mask` is undefined, else only where the (B, 1, T, S) bool mask is true.
at::Tensor ScaledDotProductAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& mask);

// One contiguous cache for a batch decoded in lockstep: a preallocated (B, K, capacity, D) buffer
// per layer, filled up to length().
class KvCache : public AttentionCache {
 public:
  KvCache(const ModelConfig& config, int64_t batch, int64_t capacity, at::TensorOptions options);
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }

  int64_t past_length() const override { return length_; }
  at::Tensor Attend(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& mask) override;
  void Advance(int64_t tokens) override { length_ += tokens; }

 private:
  std::vector<at::Tensor> keys_;
  std::vector<at::Tensor> values_;
  int64_t capacity_;
  int64_t length_ = 0;
};

// Inputs of one forward pass.
struct ForwardBatch {
  at::Tensor input_ids;  // (B, T) int64
  // (B, T), or (B, S) covering the cache too: 1 for tokens, 0 for padding. Empty: all tokens.
  at::Tensor attention_mask;
  // (B, T) int64; empty: derived from the mask (the cache length is added when caching).
  at::Tensor position_ids;
  // Packed variable-length sequences: B = 1 and cu_seqlens (N + 1) int64 marks where each of
  // the N sequences starts; attention stays within a sequence and positions restart.
  at::Tensor cu_seqlens;
  // The longest packed sequence (0: read from cu_seqlens, a device sync where it lives on a GPU).
  int64_t max_seqlen = 0;
  // Packed sequences that begin with tokens computed in another sequence (rows sharing a prompt,
  // train/batching.h): sequence s holds its own tokens from position_ids[start of s] on, and its
  // keys, positions p = 0, 1, … of it, are the packed tokens key_index[key_cu_seqlens[s] + p]
  // (its own tokens' among them); key_index (K) and key_cu_seqlens (sequences + 1) int64.
  // Undefined: each sequence's keys are its own tokens. Needs position_ids.
  at::Tensor key_index;
  at::Tensor key_cu_seqlens;
  int64_t key_max_seqlen = 0;  // the most keys of a sequence; 0: read from key_cu_seqlens
};

// The layer math on explicit weights. The modules below call these with their parameters and the
// tensor-parallel model (worker/parallel/tensor_parallel.h) with one rank's slices, so the
// decoder's numerics exist once.

// RMS norm of x (..., dim) in float32 (float64 stays), then the weight (dim); fused with the
// weight when the dtypes allow. In x's dtype, or the wider of it and the weight's; in `output`
// where given (the dtype of the GEMMs that read it: one kernel on a GPU, fused_ops.h).
at::Tensor ApplyRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps,
                        std::optional<at::ScalarType> output = std::nullopt);

// y = x W^T + b, weight (out, in), bias (out) or undefined: x is rounded to the weight's dtype
// (the GEMM's input) and y comes out float32 (float64 stays); inside an autocast region, whatever
// the weight's dtype, the GEMM and y are in the autocast dtype. (..., in) → (..., out).
at::Tensor Project(const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& x);

// A LoRA adapter on one linear layer (PEFT's lora_A and lora_B, worker/model/lora.h): the layer
// computes x W^T + b + scaling (x A^T) B^T. Undefined tensors: no adapter.
struct LowRankAdapter {
  at::Tensor a;  // (r, in)
  at::Tensor b;  // (out, r)
  double scaling = 0;
};

// Project plus the adapter's term, when it has one and its scaling is not 0.
at::Tensor Project(const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& x,
                   const LowRankAdapter& adapter);

// What a model with weights of `type` accumulates in and keeps its residual stream in: float64
// stays float64 (gradient checks), everything narrower widens to float32.
at::ScalarType AccumulationType(at::ScalarType type);

// Per-forward data shared by every layer's attention.
struct AttentionContext {
  at::Tensor cos, sin;  // (B, T, D)
  // (B, 1, T, S) bool: true where a query may attend a key. Undefined for a plain causal batch
  // (no padding, packing or cache), which lets SDPA pick its fused causal kernels.
  at::Tensor mask;
  AttentionCache* cache = nullptr;
  // The LoRA adapters' scaling (alpha / rank) for this forward; 0 runs the base weights alone
  // (the reference's forward on an adapted actor).
  double adapter_scaling = 0;
  // Packed sequences on a GPU in bf16 / fp16 (VarlenAttentionApplies): cu_seqlens (N + 1) int32
  // and the longest sequence, for FlashAttention's variable-length kernel, which computes no
  // padding and no (T, T) mask; `mask` is then undefined.
  at::Tensor varlen_cu_seqlens;
  int64_t varlen_max_seqlen = 0;
  // Sequences whose keys include other sequences' tokens (ForwardBatch::key_index): the packed
  // keys and values are gathered by varlen_key_index (K int64) into sequences at
  // varlen_key_cu_seqlens (N + 1 int32). Undefined: the queries' own.
  at::Tensor varlen_key_index;
  at::Tensor varlen_key_cu_seqlens;
  int64_t varlen_key_max_seqlen = 0;
};

// One attention block's input-side weights (Hugging Face's self_attn.{q,k,v}_proj and q/k_norm):
// the whole block's, or one tensor-parallel rank's heads. `heads` and `kv_heads` count the heads
// these weights hold.
struct AttentionWeights {
  at::Tensor q_weight, q_bias, k_weight, k_bias, v_weight, v_bias;  // biases may be undefined
  LowRankAdapter q_adapter, k_adapter, v_adapter;                   // LoRA, where adapted
  at::Tensor q_norm, k_norm;  // (D); undefined without qk-norm
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  double eps = 0;  // of q_norm and k_norm
};

// Attention of x (B, T, C) up to, not including, the output projection: q/k/v projections,
// qk-norm, RoPE, then attention (through context.cache, as `layer`, when there is one).
// Returns (B, T, heads * D) in the GEMMs' dtype.
at::Tensor AttentionHeads(const AttentionWeights& weights, const at::Tensor& x,
                          const AttentionContext& context, int64_t layer);

// A layer recomputed in backward (activation checkpointing, ZeRO-3's gathered layers) keeps its
// attention context in the autograd context: every field, so the recompute attends as the forward
// did, and the autocast state of the device the forward ran on (context.cos's). The restored
// context has no cache.
void SaveAttentionContext(torch::autograd::AutogradContext* ctx, const AttentionContext& context);
AttentionContext RestoredAttentionContext(torch::autograd::AutogradContext* ctx);

// While alive, the calling thread computes under the autocast state SaveAttentionContext kept
// (the recompute runs wherever backward runs: on a GPU, in the autograd engine's device thread,
// whose own state is autocast off); on exit that thread's state comes back and autocast's cached
// casts are dropped: a recompute needs them no longer, and a gathered layer's (ZeRO-3) would keep
// its full parameters alive.
class ForwardAutocast {
 public:
  ForwardAutocast(torch::autograd::AutogradContext* ctx, at::DeviceType device);
  ~ForwardAutocast();
  ForwardAutocast(const ForwardAutocast&) = delete;
  ForwardAutocast& operator=(const ForwardAutocast&) = delete;

 private:
  at::DeviceType device_;
  bool was_enabled_;
  at::ScalarType was_dtype_;
};

// Whether packed sequences on `device`, attended in `compute`, go through FlashAttention's
// variable-length kernel: CUDA (sm80 or newer), bf16 or fp16, head_dim ≤ 256 in multiples of 8.
bool VarlenAttentionApplies(const at::Device& device, at::ScalarType compute, int64_t head_dim);

// The gated MLP's hidden activation silu(x G^T + g) * (x U^T + u): (B, T, C) → (B, T, F), for
// the down projection to follow: float32, or the GEMMs' dtype where they compute in bf16 / fp16
// on a GPU or under autocast. Biases may be undefined, adapters empty.
at::Tensor GatedActivation(const at::Tensor& gate_weight, const at::Tensor& gate_bias,
                           const at::Tensor& up_weight, const at::Tensor& up_bias,
                           const at::Tensor& x, const LowRankAdapter& gate_adapter = {},
                           const LowRankAdapter& up_adapter = {});

// The adapter registered on `layer` (its lora_A and lora_B children, worker/model/lora.h) at
// `scaling`; empty when it has none or scaling is 0.
LowRankAdapter AdapterOf(const torch::nn::Linear& layer, double scaling);

class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int64_t dim, double eps);
  // (..., dim); `output` as in ApplyRmsNorm.
  at::Tensor forward(const at::Tensor& x, std::optional<at::ScalarType> output = std::nullopt);
  // (x + delta, forward(x + delta, output)): a residual add and this norm, one kernel where the
  // norm's is fused (the sum float32 either way for a float32 x).
  std::pair<at::Tensor, at::Tensor> AddThenForward(const at::Tensor& x, const at::Tensor& delta,
                                                   at::ScalarType output);
  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RmsNorm);

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const ModelConfig& config, int64_t layer);
  at::Tensor forward(const at::Tensor& x, const AttentionContext& context);  // (B, T, C)
  // The dtype its projections read their input in (the GEMMs' dtype).
  at::ScalarType InputType() const;

 private:
  int64_t layer_, heads_, kv_heads_, head_dim_;
  double eps_;
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RmsNorm q_norm{nullptr}, k_norm{nullptr};
};
TORCH_MODULE(Attention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const ModelConfig& config);
  // (B, T, C) → (B, T, C) via (B, T, F); `adapter_scaling` as in AttentionContext.
  at::Tensor forward(const at::Tensor& x, double adapter_scaling = 0);
  // The dtype its gate and up projections read their input in (the GEMMs' dtype).
  at::ScalarType InputType() const;

 private:
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Mlp);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const ModelConfig& config, int64_t layer);
  at::Tensor forward(const at::Tensor& x, const AttentionContext& context);

 private:
  Attention self_attn{nullptr};
  Mlp mlp{nullptr};
  RmsNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(DecoderLayer);

// Hugging Face's "model": embeddings, layers, final norm.
class DecoderImpl : public torch::nn::Module {
 public:
  explicit DecoderImpl(const ModelConfig& config);
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RmsNorm norm{nullptr};
};
TORCH_MODULE(Decoder);

class TransformerImpl : public torch::nn::Module {
 public:
  explicit TransformerImpl(const ModelConfig& config);

  // Final hidden states (B, T, C), float32. With a cache, keys/values of the new tokens are
  // appended.
  at::Tensor Hidden(const ForwardBatch& batch, AttentionCache* cache = nullptr);
  // Whether Hidden runs packed sequences (cu_seqlens) on `device` through the variable-length
  // kernel, with the autocast state as it is now (VarlenAttentionApplies).
  bool PacksWithVarlenAttention(const at::Device& device);
  // Next-token logits (B, T, V), float32 (in the autocast dtype inside an autocast region).
  // Causal-LM head only.
  at::Tensor Logits(const at::Tensor& hidden);
  // Per-token scores (B, T, L), float32. Score heads only.
  at::Tensor Scores(const at::Tensor& hidden);

  // The (V, C) weight that Logits multiplies by: the LM head, or the embeddings when tied.
  const at::Tensor& HeadWeight() const {
    return lm_head ? lm_head->weight : model->embed_tokens->weight;
  }

  const ModelConfig& config() const { return config_; }

  // Training: keep only each decoder layer's input and recompute the layer in backward (when
  // grad mode is on and no cache is used), trading compute for activation memory.
  void set_activation_checkpointing(bool on) { activation_checkpointing_ = on; }
  bool activation_checkpointing() const { return activation_checkpointing_; }

  // LoRA (worker/model/lora.h): the scaling of the adapters added to the linear layers (0: none),
  // and whether forwards use them (off: the base model, as the reference sees it).
  void set_adapter_scaling(double scaling) { adapter_scaling_ = scaling; }
  double adapter_scaling() const { return adapter_scaling_; }
  void set_adapters_enabled(bool on) { adapters_enabled_ = on; }
  bool adapters_enabled() const { return adapters_enabled_; }

  // Runs every decoder layer through `runner` instead of calling it directly (fully sharded
  // data parallelism gathers the layer's parameters around it). Empty: direct calls.
  using LayerRunner =
      std::function<at::Tensor(int64_t index, DecoderLayerImpl& layer, const at::Tensor& x,
                               const AttentionContext& context)>;
  void set_layer_runner(LayerRunner runner) { layer_runner_ = std::move(runner); }

 private:
  ModelConfig config_;
  bool activation_checkpointing_ = false;
  double adapter_scaling_ = 0;
  bool adapters_enabled_ = true;
  LayerRunner layer_runner_;
  at::Tensor inv_freq_;  // (D/2) float32, not a parameter; moved to the inputs' device on use
  Decoder model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // Absent when tied to the embeddings.
  torch::nn::Linear score{nullptr};
};
TORCH_MODULE(Transformer);

// Copies every parameter from `weights` (strict: lists missing, unexpected and mismatched
// tensors, each by name, in one error). Converts dtype and device as it copies. Parameters named
// in `fresh` keep their values and need not be in `weights`; tensors named in `ignored` may be.
absl::Status LoadWeights(Transformer& model, const StateDict& weights,
                         const std::set<std::string>& fresh = {},
                         const std::set<std::string>& ignored = {});

// Token ids must index the embedding: every entry of `ids` (int64, any shape) in [0,
// vocab_size). INVALID_ARGUMENT naming `what` and the first id out of range otherwise; call it
// wherever ids from outside (a file, a peer, a user) enter a forward.
absl::Status CheckTokenIds(const at::Tensor& ids, int64_t vocab_size, absl::string_view what);

}  // namespace rlhfd::model
