#include "worker/parallel/tensor_parallel.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "worker/model/rope.h"

namespace rlhfd::parallel {
namespace {

// Megatron's conjugate operators, so the tensor-parallel forward trains: g (all-reduce forward,
// identity backward) after the row-parallel layers and the vocabulary-parallel embedding and
// sums, and f (identity forward, all-reduce backward) before the column-parallel layers, where a
// replicated input fans out into per-rank partial gradients. The context outlives the graph; a
// failed all-reduce is recorded there (exceptions must not leave the autograd engine's threads).
class ReduceFromTensorParallel : public torch::autograd::Function<ReduceFromTensorParallel> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* /*ctx*/, const at::Tensor& x,
                            int64_t context) {
    auto* tp = reinterpret_cast<TensorParallelContext*>(context);
    at::Tensor sum = x.clone();
    if (tp->status.ok()) tp->status = tp->group->AllReduce(sum, ReduceOp::kSum);
    return sum;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* /*ctx*/,
                                                 torch::autograd::variable_list grad) {
    return {grad[0], at::Tensor()};
  }
};

class CopyToTensorParallel : public torch::autograd::Function<CopyToTensorParallel> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t context) {
    ctx->saved_data["context"] = context;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto* tp = reinterpret_cast<TensorParallelContext*>(ctx->saved_data["context"].toInt());
    at::Tensor sum = grad[0].clone();
    if (tp->status.ok()) tp->status = tp->group->AllReduce(sum, ReduceOp::kSum);
    return {sum, at::Tensor()};
  }
};

}  // namespace

at::Tensor TensorParallelTransformer::ReduceFrom(const at::Tensor& x) const {
  return ReduceFromTensorParallel::apply(x, reinterpret_cast<int64_t>(context_.get()));
}

at::Tensor TensorParallelTransformer::CopyTo(const at::Tensor& x) const {
  return CopyToTensorParallel::apply(x, reinterpret_cast<int64_t>(context_.get()));
}

absl::Status TensorParallelTransformer::TakeStatus() {
  absl::Status status = std::move(context_->status);
  context_->status = absl::OkStatus();
  return status;
}

std::vector<ShardedParameter> TensorParallelSpecs(const model::ModelConfig& c) {
  const int64_t q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  std::vector<ShardedParameter> specs = {
      {"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, 0},
      {"model.norm.weight", {c.hidden_size}, -1}};
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}, 0});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    specs.push_back({p + "input_layernorm.weight", {c.hidden_size}, -1});
    specs.push_back({p + "post_attention_layernorm.weight", {c.hidden_size}, -1});
    specs.push_back({p + "self_attn.q_proj.weight", {q, c.hidden_size}, 0});
    specs.push_back({p + "self_attn.k_proj.weight", {kv, c.hidden_size}, 0});
    specs.push_back({p + "self_attn.v_proj.weight", {kv, c.hidden_size}, 0});
    specs.push_back({p + "self_attn.o_proj.weight", {c.hidden_size, q}, 1});
    if (c.attention_bias) {
      specs.push_back({p + "self_attn.q_proj.bias", {q}, 0});
      specs.push_back({p + "self_attn.k_proj.bias", {kv}, 0});
      specs.push_back({p + "self_attn.v_proj.bias", {kv}, 0});
    }
    if (c.output_bias) specs.push_back({p + "self_attn.o_proj.bias", {c.hidden_size}, -1});
    if (c.qk_norm) {
      specs.push_back({p + "self_attn.q_norm.weight", {c.head_dim}, -1});
      specs.push_back({p + "self_attn.k_norm.weight", {c.head_dim}, -1});
    }
    specs.push_back({p + "mlp.gate_proj.weight", {c.intermediate_size, c.hidden_size}, 0});
    specs.push_back({p + "mlp.up_proj.weight", {c.intermediate_size, c.hidden_size}, 0});
    specs.push_back({p + "mlp.down_proj.weight", {c.hidden_size, c.intermediate_size}, 1});
    if (c.mlp_bias) {
      specs.push_back({p + "mlp.gate_proj.bias", {c.intermediate_size}, 0});
      specs.push_back({p + "mlp.up_proj.bias", {c.intermediate_size}, 0});
      specs.push_back({p + "mlp.down_proj.bias", {c.hidden_size}, -1});
    }
  }
  return specs;
}

absl::StatusOr<double> ClipTensorParallelGradNorm(const std::vector<ShardedParameter>& specs,
                                                  const std::map<std::string, at::Tensor>& slices,
                                                  Communicator& group, double max_norm) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> split, replicated;
  for (const ShardedParameter& spec : specs) {
    auto it = slices.find(spec.name);
    if (it == slices.end()) return absl::InvalidArgumentError("missing slice " + spec.name);
    const at::Tensor& grad = it->second.grad();
    if (grad.defined()) (spec.tp_dim >= 0 ? split : replicated).push_back(grad);
  }
  if (split.empty() && replicated.empty()) return 0.0;
  const at::TensorOptions options =
      (split.empty() ? replicated : split).front().options().dtype(at::kDouble);
  // One norm per tensor in one launch (as train::AdamW), then the sum of their squares.
  const auto squares = [&options](const std::vector<at::Tensor>& grads) {
    if (grads.empty()) return at::zeros({1}, options);
    return at::stack(at::_foreach_norm(grads, 2)).to(at::kDouble).pow(2).sum().reshape({1});
  };
  at::Tensor total = squares(split);
  RETURN_IF_ERROR(group.AllReduce(total, ReduceOp::kSum));
  const double norm = std::sqrt((total + squares(replicated)).item<double>());
  if (max_norm > 0 && std::isfinite(norm) && norm > max_norm) {
    // As torch's clip_grad_norm_ and train::AdamW.
    for (auto* grads : {&split, &replicated}) {
      for (at::Tensor& g : *grads) g.mul_(max_norm / (norm + 1e-6));
    }
  }
  return norm;
}

TensorParallelTransformer::TensorParallelTransformer(const model::ModelConfig& config,
                                                     std::map<std::string, at::Tensor> slices,
                                                     Communicator& group)
    : config_(config),
      w_(std::move(slices)),
      group_(&group),
      context_(std::make_unique<TensorParallelContext>(TensorParallelContext{&group})) {
  const at::Tensor& embed = W("model.embed_tokens.weight");
  vocab_size_ = embed.size(0);
  vocab_begin_ = group.rank() * vocab_size_;
  inv_freq_ = model::RopeInverseFrequencies(config.rope, config.head_dim).to(embed.device());
}

absl::Status CheckTensorParallelSlices(const model::ModelConfig& config,
                                       const std::map<std::string, at::Tensor>& slices, int tp) {
  if (config.head != model::HeadKind::kCausalLm) {
    return absl::InvalidArgumentError("tensor parallelism here serves causal-LM models");
  }
  for (const auto& [what, value] : {std::pair{"num_attention_heads", config.num_heads},
                                    std::pair{"num_key_value_heads", config.num_kv_heads},
                                    std::pair{"intermediate_size", config.intermediate_size},
                                    std::pair{"vocab_size", config.vocab_size}}) {
    if (value % tp != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " (", value, ") does not divide by tensor-parallel size ", tp));
    }
  }
  for (const ShardedParameter& spec : TensorParallelSpecs(config)) {
    auto it = slices.find(spec.name);
    if (it == slices.end()) return absl::InvalidArgumentError("missing slice " + spec.name);
    std::vector<int64_t> shape = spec.shape;
    if (spec.tp_dim >= 0) shape[spec.tp_dim] /= tp;
    if (it->second.sizes() != at::IntArrayRef(shape)) {
      return absl::InvalidArgumentError("slice " + spec.name + " has the wrong shape");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorParallelTransformer> TensorParallelTransformer::Create(
    const model::ModelConfig& config, std::map<std::string, at::Tensor> slices,
    Communicator& group) {
  RETURN_IF_ERROR(CheckTensorParallelSlices(config, slices, group.size()));
  return TensorParallelTransformer(config, std::move(slices), group);
}

const at::Tensor& TensorParallelTransformer::W(const std::string& name) const {
  static const at::Tensor kNone;
  auto it = w_.find(name);
  return it == w_.end() ? kNone : it->second;
}

absl::StatusOr<at::Tensor> TensorParallelTransformer::Hidden(const at::Tensor& ids) {
  const int64_t b = ids.size(0), t = ids.size(1);
  const at::Tensor& embed = W("model.embed_tokens.weight");
  // The residual stream in float32 whatever the weights' dtype, as the decoder's.
  const at::ScalarType residual = model::AccumulationType(embed.scalar_type());
  at::Tensor x = ReduceFrom(LocalEmbeddingRows(embed, ids, vocab_begin_).to(residual));
  const at::Tensor positions = at::arange(t, ids.options()).unsqueeze(0).expand({b, t});
  auto [cos, sin] = model::RopeCosSin(inv_freq_, positions, residual);
  // Right-padded batches attend causally: no mask, no cache.
  const model::AttentionContext context{cos, sin, at::Tensor(), nullptr};
  const double eps = config_.rms_norm_eps;
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    const model::AttentionWeights attention_weights{
        .q_weight = W(p + "self_attn.q_proj.weight"),
        .q_bias = W(p + "self_attn.q_proj.bias"),
        .k_weight = W(p + "self_attn.k_proj.weight"),
        .k_bias = W(p + "self_attn.k_proj.bias"),
        .v_weight = W(p + "self_attn.v_proj.weight"),
        .v_bias = W(p + "self_attn.v_proj.bias"),
        .q_norm = W(p + "self_attn.q_norm.weight"),
        .k_norm = W(p + "self_attn.k_norm.weight"),
        .heads = config_.num_heads / group_->size(),
        .kv_heads = config_.num_kv_heads / group_->size(),
        .head_dim = config_.head_dim,
        .eps = eps};
    const at::Tensor heads = model::AttentionHeads(
        attention_weights, CopyTo(model::ApplyRmsNorm(x, W(p + "input_layernorm.weight"), eps)),
        context, i);
    // Row-parallel o_proj: partial sums, then the all-reduce; its bias (replicated) once after.
    at::Tensor o =
        ReduceFrom(model::Project(W(p + "self_attn.o_proj.weight"), at::Tensor(), heads));
    if (W(p + "self_attn.o_proj.bias").defined()) o = o + W(p + "self_attn.o_proj.bias");
    x = x + o;
    const at::Tensor activation = model::GatedActivation(
        W(p + "mlp.gate_proj.weight"), W(p + "mlp.gate_proj.bias"), W(p + "mlp.up_proj.weight"),
        W(p + "mlp.up_proj.bias"),
        CopyTo(model::ApplyRmsNorm(x, W(p + "post_attention_layernorm.weight"), eps)));
    at::Tensor down =
        ReduceFrom(model::Project(W(p + "mlp.down_proj.weight"), at::Tensor(), activation));
    if (W(p + "mlp.down_proj.bias").defined()) down = down + W(p + "mlp.down_proj.bias");
    x = x + down;
  }
  RETURN_IF_ERROR(TakeStatus());
  return model::ApplyRmsNorm(x, W("model.norm.weight"), eps).to(residual);
}

at::Tensor TensorParallelTransformer::LocalLogits(const at::Tensor& hidden) const {
  const at::Tensor& head =
      config_.tie_word_embeddings ? W("model.embed_tokens.weight") : W("lm_head.weight");
  return model::Project(head, at::Tensor(), CopyTo(hidden));  // (B, T, V / tp) float32
}

absl::StatusOr<at::Tensor> TensorParallelTransformer::TokenLogProbs(const at::Tensor& hidden,
                                                                    const at::Tensor& targets) {
  const at::Tensor logits = LocalLogits(hidden);
  // Parallel log-softmax: the global max (a constant for the gradient: it cancels), then the
  // global sum of exponentials.
  at::Tensor max = std::get<0>(logits.detach().max(-1));
  RETURN_IF_ERROR(group_->AllReduce(max, ReduceOp::kMax));
  const at::Tensor sum = ReduceFrom((logits - max.unsqueeze(-1)).exp().sum(-1));
  // The target's logit lives on one rank; the others contribute zero.
  const at::Tensor local = targets - vocab_begin_;
  const at::Tensor mine = (local >= 0).logical_and(local < vocab_size_);
  const at::Tensor target_logit =
      ReduceFrom(logits.gather(-1, local.clamp(0, vocab_size_ - 1).unsqueeze(-1)).squeeze(-1) *
                 mine.to(logits.scalar_type()));
  RETURN_IF_ERROR(TakeStatus());
  return target_logit - max - sum.log();
}

absl::StatusOr<at::Tensor> TensorParallelTransformer::Argmax(const at::Tensor& hidden) {
  const at::Tensor logits = LocalLogits(hidden);
  auto [value, index] = logits.max(-1);
  // Every rank's best (value, global id); the winner is the largest value, lowest id on ties.
  const int tp = group_->size();
  at::Tensor candidates = at::stack({value.to(at::kDouble), (index + vocab_begin_).to(at::kDouble)})
                              .contiguous();  // (2, B, T)
  at::Tensor all = at::empty({tp * 2, hidden.size(0), hidden.size(1)}, candidates.options());
  RETURN_IF_ERROR(group_->AllGather(candidates, all));
  all = all.view({tp, 2, hidden.size(0), hidden.size(1)});
  const at::Tensor values = all.select(1, 0), ids = all.select(1, 1);  // (tp, B, T)
  const at::Tensor best = std::get<0>(values.max(0));
  // Lowest id among the ranks reaching the best value (ranks hold increasing id ranges).
  const at::Tensor reaching = values == best.unsqueeze(0);
  const at::Tensor chosen = at::where(reaching, ids, at::full_like(ids, 1e18));
  return std::get<0>(chosen.min(0)).to(at::kLong);
}

absl::StatusOr<at::Tensor> TensorParallelTransformer::Logits(const at::Tensor& hidden) {
  return GatherVocabulary(*group_, LocalLogits(hidden));  // (B, T, V)
}

at::Tensor LocalEmbeddingRows(const at::Tensor& embed, const at::Tensor& ids, int64_t vocab_begin) {
  const int64_t vocab = embed.size(0);
  const at::Tensor local = ids - vocab_begin;
  const at::Tensor mine = local.ge(0).logical_and(local.lt(vocab)).unsqueeze(-1);
  return at::embedding(embed, local.clamp(0, vocab - 1)) * mine.to(embed.scalar_type());
}

absl::StatusOr<at::Tensor> GatherVocabulary(Communicator& group, const at::Tensor& local,
                                            bool queued) {
  const at::Tensor part = local.contiguous();
  const int64_t tp = group.size();
  std::vector<int64_t> stacked = part.sizes().vec();  // every rank's along dim 0, as AllGather
  stacked[0] *= tp;
  const at::Tensor all = at::empty(stacked, part.options());
  RETURN_IF_ERROR(queued ? group.AllGatherQueued(part, all) : group.AllGather(part, all));
  // (tp, ..., V / tp) → (..., tp, V / tp): rank r's range follows rank r - 1's.
  std::vector<int64_t> ranked = part.sizes().vec();
  ranked.insert(ranked.begin(), tp);
  std::vector<int64_t> order;
  for (int64_t d = 1; d + 1 < static_cast<int64_t>(ranked.size()); ++d) order.push_back(d);
  order.push_back(0);
  order.push_back(static_cast<int64_t>(ranked.size()) - 1);
  std::vector<int64_t> joined(part.sizes().begin(), part.sizes().end() - 1);
  joined.push_back(tp * part.size(-1));
  return all.view(ranked).permute(order).reshape(joined);
}

absl::StatusOr<std::vector<int64_t>> TensorParallelTransformer::Greedy(const at::Tensor& prompt,
                                                                       int64_t new_tokens) {
  at::Tensor ids = prompt;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < new_tokens; ++i) {
    ASSIGN_OR_RETURN(const at::Tensor hidden, Hidden(ids));
    ASSIGN_OR_RETURN(const at::Tensor next, Argmax(hidden.narrow(1, ids.size(1) - 1, 1)));
    out.push_back(next.item<int64_t>());
    ids = at::cat({ids, next.view({1, 1}).to(ids.device())}, 1);
  }
  return out;
}

}  // namespace rlhfd::parallel
