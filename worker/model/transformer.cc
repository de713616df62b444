// Transformer forward; see transformer.h for the shape legend.
#include "worker/model/transformer.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/options/linear.h>

#if RLHFD_HAVE_CUDA
#include <ATen/cuda/CUDAContextLight.h>
#endif
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/model/fused_ops.h"
#include "worker/model/positions_and_mask.h"
#include "worker/model/rope.h"
#include "worker/model/state_dict.h"

namespace rlhfd::model {
namespace {

torch::nn::Linear MakeLinear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// The dtype the GEMMs run in: the autocast dtype inside an autocast region (training with float32
// masters), else the weights' own.
at::ScalarType ComputeType(const at::Tensor& weight) {
  const at::DeviceType device = weight.device().type();
  return at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device)
                                                   : weight.scalar_type();
}

// Whether AttentionHeads rotates q and k (batch rows) with the fused kernel: a forward without a
// cache (the training and scoring forwards; decoding has kernels of its own) whose tables Hidden
// made in float32 for it, one row of them per batch row (ApplyRope also broadcasts one).
bool RotatesFused(const AttentionContext& context, const at::Device& device, at::ScalarType compute,
                  int64_t batch) {
  return context.cache == nullptr && context.cos.scalar_type() == at::kFloat &&
         context.cos.size(0) == batch && FusedOpsApply(device, compute);
}

at::Tensor ProjectLayer(torch::nn::Linear& layer, const at::Tensor& x, double adapter_scaling) {
  return Project(layer->weight, layer->bias, x, AdapterOf(layer, adapter_scaling));
}

}  // namespace

// float64 stays float64 (gradient checks); everything narrower accumulates in float32.
at::ScalarType AccumulationType(at::ScalarType type) {
  return type == at::kDouble ? at::kDouble : at::kFloat;
}

// The GEMM accumulates in float32 anyway, and not rounding its output to bf16 removes one of the
// two roundings every linear layer adds.
at::Tensor Project(const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& x) {
  // weight (out, in); bias (out) or undefined.
  // Under autocast (a role's GPU compute scope) every weight computes as autocast says, a float32
  // master (cast by autocast) and a narrow frozen copy alike: a frozen role's forward, the
  // reference's, is then the actor's own, so their KL starts from the same rounding, and its
  // activations are half as wide. at::linear casts the input itself; widening a bf16 input to
  // float32 first would only add a round trip.
  const bool autocast = at::autocast::is_autocast_enabled(weight.device().type());
  if (autocast || (at::isFloatingType(weight.scalar_type()) && weight.element_size() >= 4)) {
    return at::linear(autocast ? x : x.to(weight.scalar_type()), weight, bias);
  }
  at::Tensor flat = x.reshape({-1, x.size(-1)}).to(weight.scalar_type());
  at::Tensor y;
  if (!weight.is_cuda()) {
    y = at::mm(flat.to(at::kFloat), weight.t().to(at::kFloat));
  } else if (at::GradMode::is_enabled() && flat.requires_grad()) {
    // The float32-output GEMM has no derivative: a frozen narrow weight that gradients pass
    // through (a LoRA actor's base) takes the plain GEMM, its output rounded once more.
    y = at::mm(flat, weight.t()).to(at::kFloat);
  } else {
    y = at::mm(flat, weight.t(), at::kFloat);
  }
  if (bias.defined()) y = y + bias.to(at::kFloat);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = weight.size(0);
  return y.view(shape);
}

at::Tensor Project(const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& x,
                   const LowRankAdapter& adapter) {
  if (!adapter.a.defined() || adapter.scaling == 0) return Project(weight, bias, x);
  // PEFT's order: the rank-r product first, scaled last.
  const at::Tensor low_rank = Project(adapter.b, at::Tensor(), Project(adapter.a, at::Tensor(), x));
  if (!weight.is_cuda() || weight.element_size() >= 4) {
    return Project(weight, bias, x) + low_rank * adapter.scaling;
  }
  // A frozen narrow base on the GPU (a LoRA actor's): the base's product and the adapter's term
  // added in the GEMMs' dtype by one kernel, the dtype a full-weight layer's output has under
  // autocast. Widening both to float32 first made every adapted layer's output, and what backward
  // keeps of it, twice as wide, with three more passes over it: the update took 1.6x the
  // full-weight update's time (docs/PERFORMANCE.md, "LoRA actors").
  const at::ScalarType type = weight.scalar_type();
  at::Tensor y = at::add(at::mm(x.reshape({-1, x.size(-1)}).to(type), weight.t()),
                         low_rank.reshape({-1, weight.size(0)}).to(type), adapter.scaling);
  if (bias.defined()) y = y + bias.to(type);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = weight.size(0);
  return y.view(shape);
}

LowRankAdapter AdapterOf(const torch::nn::Linear& layer, double scaling) {
  if (scaling == 0) return {};
  std::shared_ptr<torch::nn::Module> a, b;
  for (const auto& child : layer->named_children()) {
    if (child.key() == "lora_A") a = child.value();
    if (child.key() == "lora_B") b = child.value();
  }
  if (a == nullptr || b == nullptr) return {};
  return {.a = a->as<torch::nn::Linear>()->weight,
          .b = b->as<torch::nn::Linear>()->weight,
          .scaling = scaling};
}

namespace {

// The float32 residual stream normalised for a sublayer's bf16 / fp16 GEMMs on a GPU: one kernel
// writes it in their dtype (ApplyRmsNorm's chain writes float32, then casts).
bool NormFuses(const at::Tensor& x, const at::Tensor& weight,
               std::optional<at::ScalarType> output) {
  return output && x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat &&
         FusedOpsApply(x.device(), *output);
}

}  // namespace

at::Tensor ApplyRmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps,
                        std::optional<at::ScalarType> output) {
  if (NormFuses(x, weight, output)) return FusedRmsNorm(x, weight, eps, *output);
  // In float32 (or wider), as transformers does, then back to the input dtype before the weight.
  // at::rms_norm is one fused kernel on the GPU (and one in its backward).
  const at::Tensor wide = x.to(AccumulationType(x.scalar_type()));
  at::Tensor y;
  if (weight.scalar_type() == wide.scalar_type() && x.scalar_type() == wide.scalar_type()) {
    y = at::rms_norm(wide, {x.size(-1)}, weight, eps);
  } else {
    y = weight * at::rms_norm(wide, {x.size(-1)}, std::nullopt, eps).to(x.scalar_type());
  }
  return output ? y.to(*output) : y;
}

at::Tensor AttentionHeads(const AttentionWeights& w, const at::Tensor& x,
                          const AttentionContext& context, int64_t layer) {
  const int64_t b = x.size(0), t = x.size(1), d = w.head_dim;
  // Projections come out float32; attention runs in the GEMMs' dtype. The input is narrowed once
  // for all three projections rather than once by each.
  const at::ScalarType compute = ComputeType(w.q_weight);
  const at::Tensor input = x.to(compute);
  at::Tensor q = Project(w.q_weight, w.q_bias, input, w.q_adapter).view({b, t, w.heads, d});
  at::Tensor k = Project(w.k_weight, w.k_bias, input, w.k_adapter).view({b, t, w.kv_heads, d});
  at::Tensor v = Project(w.v_weight, w.v_bias, input, w.v_adapter).view({b, t, w.kv_heads, d});
  if (w.q_norm.defined()) {
    q = ApplyRmsNorm(q, w.q_norm, w.eps);
    k = ApplyRmsNorm(k, w.k_norm, w.eps);
  }
  if (RotatesFused(context, x.device(), compute, b)) {
    // Rotated (B, T, heads, D) and written in the GEMMs' dtype by one kernel each; attention
    // reads the (B, heads, T, D) views.
    q = FusedRope(q, context.cos, context.sin, compute).transpose(1, 2);
    k = FusedRope(k, context.cos, context.sin, compute).transpose(1, 2);
  } else {
    q = ApplyRope(q.transpose(1, 2), context.cos, context.sin).to(compute);  // (B, H, T, D)
    k = ApplyRope(k.transpose(1, 2), context.cos, context.sin).to(compute);  // (B, K, T, D)
  }
  v = v.transpose(1, 2).to(compute);
  if (context.varlen_cu_seqlens.defined()) {
    TORCH_CHECK(b == 1, "packed sequences come as one row, not ", b);
    // B = 1: the packed tokens as (T, heads, D), the layout of the variable-length kernel, which
    // takes fewer key/value heads than query heads as they are (GQA).
    const auto tokens = [&](const at::Tensor& heads) {
      return heads.transpose(1, 2).reshape({t, heads.size(1), d});
    };
    at::Tensor keys = tokens(k), values = tokens(v);
    const bool gathered = context.varlen_key_index.defined();
    if (gathered) {  // Sequences that reuse another's prefix read its keys and values.
      keys = keys.index_select(0, context.varlen_key_index);
      values = values.index_select(0, context.varlen_key_index);
    }
    // Causal with fewer queries than keys aligns the queries with the last keys (FlashAttention
    // 2.1 on): a sequence's own tokens come after the prefix it shares.
    const at::Tensor out = std::get<0>(at::_flash_attention_forward(
        tokens(q), keys, values, context.varlen_cu_seqlens,
        gathered ? context.varlen_key_cu_seqlens : context.varlen_cu_seqlens,
        context.varlen_max_seqlen,
        gathered ? context.varlen_key_max_seqlen : context.varlen_max_seqlen, /*dropout_p=*/0.0,
        /*is_causal=*/true, /*return_debug_mask=*/false));  // (T, H, D)
    return out.reshape({b, t, w.heads * d});
  }
  at::Tensor out = context.cache != nullptr ? context.cache->Attend(layer, q, k, v, context.mask)
                                            : ScaledDotProductAttention(q, k, v, context.mask);
  return out.transpose(1, 2).reshape({b, t, w.heads * d});
}

bool VarlenAttentionApplies(const at::Device& device, at::ScalarType compute, int64_t head_dim) {
#if RLHFD_HAVE_CUDA
  if (!device.is_cuda() || (compute != at::kBFloat16 && compute != at::kHalf)) return false;
  // FlashAttention 2's limits: head dims up to 256 in multiples of 8, Ampere (sm80) or newer.
  if (head_dim > 256 || head_dim % 8 != 0) return false;
  const int index = device.has_index() ? device.index() : at::cuda::current_device();
  return at::cuda::getDeviceProperties(index)->major >= 8;  // cached by ATen
#else
  return false;  // built without CUDA
#endif
}

at::Tensor GatedActivation(const at::Tensor& gate_weight, const at::Tensor& gate_bias,
                           const at::Tensor& up_weight, const at::Tensor& up_bias,
                           const at::Tensor& x, const LowRankAdapter& gate_adapter,
                           const LowRankAdapter& up_adapter) {
  const at::ScalarType compute = ComputeType(gate_weight);
  const at::Tensor input = x.to(compute);  // Narrowed once for both.
  const at::Tensor gate = Project(gate_weight, gate_bias, input, gate_adapter);
  const at::Tensor up = Project(up_weight, up_bias, input, up_adapter);
  if (FusedOpsApply(x.device(), compute) && gate.scalar_type() == up.scalar_type()) {
    return FusedSwiGlu(gate, up, compute);
  }
  return at::silu(gate) * up;
}

KvCache::KvCache(const ModelConfig& config, int64_t batch, int64_t capacity,
                 at::TensorOptions options)
    : capacity_(capacity) {
  for (int64_t i = 0; i < config.num_layers; ++i) {
    keys_.push_back(at::zeros({batch, config.num_kv_heads, capacity, config.head_dim}, options));
    values_.push_back(at::zeros({batch, config.num_kv_heads, capacity, config.head_dim}, options));
  }
}

at::Tensor KvCache::Attend(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& v, const at::Tensor& mask) {
  const int64_t t = k.size(2);
  keys_[layer].narrow(2, length_, t).copy_(k);
  values_[layer].narrow(2, length_, t).copy_(v);
  return ScaledDotProductAttention(q, keys_[layer].narrow(2, 0, length_ + t),  // (B, K, S, D)
                                   values_[layer].narrow(2, 0, length_ + t), mask);
}

at::Tensor ScaledDotProductAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& mask) {
  const bool causal = !mask.defined();
  return at::scaled_dot_product_attention(
      q, k, v, causal ? std::nullopt : std::optional<at::Tensor>(mask), /*dropout_p=*/0.0,
      /*is_causal=*/causal, /*scale=*/std::nullopt, /*enable_gqa=*/k.size(1) != q.size(1));
}

RmsNormImpl::RmsNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor RmsNormImpl::forward(const at::Tensor& x, std::optional<at::ScalarType> output) {
  return ApplyRmsNorm(x, weight, eps_, output);
}

std::pair<at::Tensor, at::Tensor> RmsNormImpl::AddThenForward(const at::Tensor& x,
                                                              const at::Tensor& delta,
                                                              at::ScalarType output) {
  if (NormFuses(x, weight, output) && delta.device() == x.device() && delta.sizes() == x.sizes() &&
      (delta.scalar_type() == at::kFloat || delta.scalar_type() == at::kBFloat16 ||
       delta.scalar_type() == at::kHalf)) {
    return FusedAddRmsNorm(x, delta, weight, eps_, output);
  }
  at::Tensor sum = x + delta;
  at::Tensor normed = forward(sum, output);
  return {std::move(sum), std::move(normed)};
}

AttentionImpl::AttentionImpl(const ModelConfig& config, int64_t layer)
    : layer_(layer),
      heads_(config.num_heads),
      kv_heads_(config.num_kv_heads),
      head_dim_(config.head_dim),
      eps_(config.rms_norm_eps) {
  const int64_t c = config.hidden_size;
  q_proj = register_module("q_proj", MakeLinear(c, heads_ * head_dim_, config.attention_bias));
  k_proj = register_module("k_proj", MakeLinear(c, kv_heads_ * head_dim_, config.attention_bias));
  v_proj = register_module("v_proj", MakeLinear(c, kv_heads_ * head_dim_, config.attention_bias));
  o_proj = register_module("o_proj", MakeLinear(heads_ * head_dim_, c, config.output_bias));
  if (config.qk_norm) {
    q_norm = register_module("q_norm", RmsNorm(head_dim_, config.rms_norm_eps));
    k_norm = register_module("k_norm", RmsNorm(head_dim_, config.rms_norm_eps));
  }
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const AttentionContext& context) {
  const AttentionWeights weights{.q_weight = q_proj->weight,
                                 .q_bias = q_proj->bias,
                                 .k_weight = k_proj->weight,
                                 .k_bias = k_proj->bias,
                                 .v_weight = v_proj->weight,
                                 .v_bias = v_proj->bias,
                                 .q_adapter = AdapterOf(q_proj, context.adapter_scaling),
                                 .k_adapter = AdapterOf(k_proj, context.adapter_scaling),
                                 .v_adapter = AdapterOf(v_proj, context.adapter_scaling),
                                 .q_norm = q_norm ? q_norm->weight : at::Tensor(),
                                 .k_norm = k_norm ? k_norm->weight : at::Tensor(),
                                 .heads = heads_,
                                 .kv_heads = kv_heads_,
                                 .head_dim = head_dim_,
                                 .eps = eps_};
  return ProjectLayer(o_proj, AttentionHeads(weights, x, context, layer_),
                      context.adapter_scaling);  // (B, T, C)
}

at::ScalarType AttentionImpl::InputType() const { return ComputeType(q_proj->weight); }

MlpImpl::MlpImpl(const ModelConfig& config) {
  const int64_t c = config.hidden_size, f = config.intermediate_size;
  gate_proj = register_module("gate_proj", MakeLinear(c, f, config.mlp_bias));
  up_proj = register_module("up_proj", MakeLinear(c, f, config.mlp_bias));
  down_proj = register_module("down_proj", MakeLinear(f, c, config.mlp_bias));
}

at::ScalarType MlpImpl::InputType() const { return ComputeType(gate_proj->weight); }

at::Tensor MlpImpl::forward(const at::Tensor& x, double adapter_scaling) {
  return ProjectLayer(
      down_proj,
      GatedActivation(gate_proj->weight, gate_proj->bias, up_proj->weight, up_proj->bias, x,
                      AdapterOf(gate_proj, adapter_scaling), AdapterOf(up_proj, adapter_scaling)),
      adapter_scaling);
}

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& config, int64_t layer) {
  self_attn = register_module("self_attn", Attention(config, layer));
  mlp = register_module("mlp", Mlp(config));
  input_layernorm =
      register_module("input_layernorm", RmsNorm(config.hidden_size, config.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RmsNorm(config.hidden_size, config.rms_norm_eps));
}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const AttentionContext& context) {
  // x is the float32 residual stream; each norm writes it in the dtype of its sublayer's GEMMs
  // (one kernel on a GPU), and the sublayers return float32 or the GEMMs' dtype.
  const at::Tensor attended =
      self_attn(input_layernorm->forward(x, self_attn->InputType()), context);
  const auto [h, normed] = post_attention_layernorm->AddThenForward(x, attended, mlp->InputType());
  return h + mlp(normed, context.adapter_scaling);
}

DecoderImpl::DecoderImpl(const ModelConfig& config) {
  embed_tokens =
      register_module("embed_tokens", torch::nn::Embedding(config.vocab_size, config.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.num_layers; ++i) layers->push_back(DecoderLayer(config, i));
  norm = register_module("norm", RmsNorm(config.hidden_size, config.rms_norm_eps));
}

TransformerImpl::TransformerImpl(const ModelConfig& config)
    : config_(config), inv_freq_(RopeInverseFrequencies(config.rope, config.head_dim)) {
  model = register_module("model", Decoder(config));
  if (config.head == HeadKind::kCausalLm) {
    if (!config.tie_word_embeddings) {
      lm_head = register_module("lm_head",
                                MakeLinear(config.hidden_size, config.vocab_size, /*bias=*/false));
    }
  } else {
    score = register_module("score",
                            MakeLinear(config.hidden_size, config.num_labels, config.score_bias));
  }
}

void SaveAttentionContext(torch::autograd::AutogradContext* ctx, const AttentionContext& context) {
  ctx->saved_data["cos"] = context.cos;
  ctx->saved_data["sin"] = context.sin;
  ctx->saved_data["mask"] = context.mask;
  ctx->saved_data["varlen_cu_seqlens"] = context.varlen_cu_seqlens;
  ctx->saved_data["varlen_max_seqlen"] = context.varlen_max_seqlen;
  ctx->saved_data["varlen_key_index"] = context.varlen_key_index;
  ctx->saved_data["varlen_key_cu_seqlens"] = context.varlen_key_cu_seqlens;
  ctx->saved_data["varlen_key_max_seqlen"] = context.varlen_key_max_seqlen;
  ctx->saved_data["adapter_scaling"] = context.adapter_scaling;
  const at::DeviceType device = context.cos.device().type();
  ctx->saved_data["autocast"] = at::autocast::is_autocast_enabled(device);
  ctx->saved_data["autocast_dtype"] = at::autocast::get_autocast_dtype(device);
}

AttentionContext RestoredAttentionContext(torch::autograd::AutogradContext* ctx) {
  return {.cos = ctx->saved_data["cos"].toTensor(),
          .sin = ctx->saved_data["sin"].toTensor(),
          .mask = ctx->saved_data["mask"].toTensor(),
          .cache = nullptr,
          .adapter_scaling = ctx->saved_data["adapter_scaling"].toDouble(),
          .varlen_cu_seqlens = ctx->saved_data["varlen_cu_seqlens"].toTensor(),
          .varlen_max_seqlen = ctx->saved_data["varlen_max_seqlen"].toInt(),
          .varlen_key_index = ctx->saved_data["varlen_key_index"].toTensor(),
          .varlen_key_cu_seqlens = ctx->saved_data["varlen_key_cu_seqlens"].toTensor(),
          .varlen_key_max_seqlen = ctx->saved_data["varlen_key_max_seqlen"].toInt()};
}

ForwardAutocast::ForwardAutocast(torch::autograd::AutogradContext* ctx, at::DeviceType device)
    : device_(device),
      was_enabled_(at::autocast::is_autocast_enabled(device)),
      was_dtype_(at::autocast::get_autocast_dtype(device)) {
  at::autocast::set_autocast_enabled(device, ctx->saved_data["autocast"].toBool());
  at::autocast::set_autocast_dtype(device, ctx->saved_data["autocast_dtype"].toScalarType());
}

ForwardAutocast::~ForwardAutocast() {
  at::autocast::set_autocast_enabled(device_, was_enabled_);
  at::autocast::set_autocast_dtype(device_, was_dtype_);
  at::autocast::clear_cache();
}

// Activation checkpointing of one decoder layer, reentrant as torch.utils.checkpoint's default:
// the forward runs without recording a graph and keeps only the layer's input; the backward runs
// the layer again with grad on (under the autocast state of the forward) and back-propagates
// through it, which accumulates the parameters' gradients and yields the input's.
class CheckpointedLayer : public torch::autograd::Function<CheckpointedLayer> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            DecoderLayerImpl* layer, const AttentionContext& context) {
    // The layer outlives the step; its address rides in the context as an integer.
    ctx->saved_data["layer"] = reinterpret_cast<int64_t>(layer);
    SaveAttentionContext(ctx, context);
    ctx->save_for_backward({x});
    return layer->forward(x, context);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto* layer = reinterpret_cast<DecoderLayerImpl*>(ctx->saved_data["layer"].toInt());
    const AttentionContext context = RestoredAttentionContext(ctx);
    const at::Tensor input = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    at::Tensor output;
    {
      const ForwardAutocast autocast(ctx, input.device().type());
      at::AutoGradMode grad(true);
      output = layer->forward(input, context);
    }
    torch::autograd::backward({output}, {grad_outputs[0]});
    return {input.grad(), at::Tensor(), at::Tensor()};
  }
};

bool TransformerImpl::PacksWithVarlenAttention(const at::Device& device) {
  return VarlenAttentionApplies(device, ComputeType(model->embed_tokens->weight), config_.head_dim);
}

at::Tensor TransformerImpl::Hidden(const ForwardBatch& batch, AttentionCache* cache) {
  const int64_t past = cache != nullptr ? cache->past_length() : 0;
  TORCH_CHECK(
      !batch.key_index.defined() || (batch.cu_seqlens.defined() && batch.key_cu_seqlens.defined() &&
                                     batch.position_ids.defined() && cache == nullptr),
      "shared keys (key_index) need packed sequences, their key_cu_seqlens and "
      "position_ids, and no cache");
  const bool varlen = batch.cu_seqlens.defined() && cache == nullptr &&
                      PacksWithVarlenAttention(batch.input_ids.device());
  auto [positions, mask] = PositionsAndMask(batch, past, varlen);
  // The residual stream stays in float32 whatever the weights' dtype: in bf16 its rounding, added
  // up over the layers, costs more accuracy than the matmuls do (docs/architecture.md).
  const at::ScalarType residual = AccumulationType(model->embed_tokens->weight.scalar_type());
  at::Tensor x = model->embed_tokens(batch.input_ids).to(residual);  // (B, T, C)
  // The fused rotary kernel reads float32 tables (RotatesFused). ATen's chain under autocast
  // gets the projections in the autocast dtype, where rotating in float32 would only add casts;
  // outside it, rotation runs in float32 for accuracy.
  const at::DeviceType device = batch.input_ids.device().type();
  const at::ScalarType rope_dtype =
      cache == nullptr &&
              FusedOpsApply(batch.input_ids.device(), ComputeType(model->embed_tokens->weight))
          ? at::kFloat
      : at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device)
                                                  : residual;
  // Kept on the inputs' device once there, so decode steps (and CUDA graphs of them) copy nothing.
  if (inv_freq_.device() != positions.device()) inv_freq_ = inv_freq_.to(positions.device());
  auto [cos, sin] = RopeCosSin(inv_freq_, positions, rope_dtype);
  AttentionContext context{.cos = cos,
                           .sin = sin,
                           .mask = mask,
                           .cache = cache,
                           .adapter_scaling = adapters_enabled_ ? adapter_scaling_ : 0};
  if (varlen) {
    context.varlen_cu_seqlens = batch.cu_seqlens.to(batch.input_ids.device(), at::kInt);
    context.varlen_max_seqlen = batch.max_seqlen > 0
                                    ? batch.max_seqlen
                                    : (batch.cu_seqlens.narrow(0, 1, batch.cu_seqlens.size(0) - 1) -
                                       batch.cu_seqlens.narrow(0, 0, batch.cu_seqlens.size(0) - 1))
                                          .max()
                                          .item<int64_t>();
    if (batch.key_index.defined()) {
      const at::Tensor& key_starts = batch.key_cu_seqlens;
      const int64_t sequences = key_starts.size(0) - 1;
      context.varlen_key_index = batch.key_index.to(batch.input_ids.device());
      context.varlen_key_cu_seqlens = key_starts.to(batch.input_ids.device(), at::kInt);
      context.varlen_key_max_seqlen =
          batch.key_max_seqlen > 0
              ? batch.key_max_seqlen
              : (key_starts.narrow(0, 1, sequences) - key_starts.narrow(0, 0, sequences))
                    .max()
                    .item<int64_t>();
    }
  }
  const bool checkpoint =
      activation_checkpointing_ && cache == nullptr && at::GradMode::is_enabled();
  int64_t index = 0;
  for (const auto& layer : *model->layers) {
    DecoderLayerImpl* decoder_layer = layer->as<DecoderLayer>();
    x = layer_runner_ ? layer_runner_(index, *decoder_layer, x, context)
        : checkpoint  ? CheckpointedLayer::apply(x, decoder_layer, context)
                      : decoder_layer->forward(x, context);
    ++index;
  }
  if (cache != nullptr) cache->Advance(batch.input_ids.size(1));
  return model->norm(x).to(residual);
}

at::Tensor TransformerImpl::Logits(const at::Tensor& hidden) {
  TORCH_CHECK(config_.head == HeadKind::kCausalLm, "Logits needs a causal-LM model");
  // Outside autocast, logits come out in float32: rounding them to bf16 alone would cost ~0.4%
  // relative error.
  return Project(lm_head ? lm_head->weight : model->embed_tokens->weight, at::Tensor(), hidden);
}

at::Tensor TransformerImpl::Scores(const at::Tensor& hidden) {
  TORCH_CHECK(score,
              "Scores needs a score head (*ForSequenceClassification / TokenClassification)");
  // L is tiny, so the head runs in float32 outright.
  const at::ScalarType type = AccumulationType(score->weight.scalar_type());
  return at::linear(hidden.to(type), score->weight.to(type),
                    score->bias.defined() ? score->bias.to(type) : at::Tensor());
}

absl::Status CheckTokenIds(const at::Tensor& ids, int64_t vocab_size, absl::string_view what) {
  if (!ids.defined() || ids.numel() == 0) return absl::OkStatus();
  if (ids.scalar_type() != at::kLong) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": token ids must be int64"));
  }
  const at::Tensor outside = ids.lt(0).logical_or(ids.ge(vocab_size));
  if (!outside.any().item<bool>()) return absl::OkStatus();
  const int64_t first = ids.flatten().index({outside.flatten()})[0].item<int64_t>();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": token id ", first, " is outside the model's vocabulary [0, ",
                   vocab_size, "); was the text tokenized with another model's tokenizer?"));
}

absl::Status LoadWeights(Transformer& model, const StateDict& weights,
                         const std::set<std::string>& fresh, const std::set<std::string>& ignored) {
  std::vector<std::string> missing, mismatched, unexpected;
  std::set<std::string> expected;
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    at::Tensor& parameter = item.value();
    expected.insert(name);
    if (fresh.count(name)) continue;
    auto tensor = weights.Get(name);
    if (!tensor.ok()) {
      missing.push_back(name);
      continue;
    }
    if (tensor->sizes() != parameter.sizes()) {
      mismatched.push_back(absl::StrCat(name, " (file ", ShapeString(tensor->sizes()), ", model ",
                                        ShapeString(parameter.sizes()), ")"));
      continue;
    }
    parameter.copy_(*tensor);
  }
  for (const std::string& name : weights.names()) {
    // Tied checkpoints sometimes still carry the head; the embeddings are the weight used.
    if (name == "lm_head.weight" && model->config().tie_word_embeddings) continue;
    // Llama-2-era checkpoints carry the rotary frequencies as a buffer; they are computed here
    // (from rope_theta), as transformers drops them too.
    if (absl::EndsWith(name, ".rotary_emb.inv_freq")) continue;
    if (ignored.count(name)) continue;
    if (!expected.count(name)) unexpected.push_back(name);
  }
  return TensorMismatch("checkpoint does not match the model:", missing, unexpected, mismatched);
}

}  // namespace rlhfd::model
