#include "worker/rollout/fused_decoder.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "worker/model/rope.h"
#include "worker/parallel/tensor_parallel.h"
#include "worker/rollout/decode_attention.h"
#if RLHFD_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>

#include "worker/rollout/kernels.h"
#endif

namespace rlhfd::rollout {
namespace {

// The parts stacked along dim 0, or undefined when any is (e.g. biases a model does not have).
at::Tensor Concat(const std::vector<at::Tensor>& parts) {
  for (const at::Tensor& part : parts) {
    if (!part.defined()) return at::Tensor();
  }
  return at::cat(parts, 0);
}

}  // namespace

bool FusedDecoder::Supports(const model::Transformer& model) {
  return Supports(model->config(), model->HeadWeight());
}

bool FusedDecoder::Supports(const model::ModelConfig& c, const at::Tensor& weight, int tp) {
#if !RLHFD_HAVE_CUDA
  return false;  // The kernels are CUDA's.
#else
  // A rank's part: SiLU·up reads its MLP columns in pairs; the norm, the hidden size in fours
  // (kernels::AddRmsNorm); the decode attention its head shapes (a rank's heads have the same
  // group; the cache's blocks are multiples of 32 positions, PagedKvCache checks).
  return weight.is_cuda() && weight.scalar_type() == at::kBFloat16 && c.hidden_size % 4 == 0 &&
         c.hidden_size <= 16384 && tp >= 1 && c.intermediate_size % tp == 0 &&
         (c.intermediate_size / tp) % 2 == 0 &&
         kernels::DecodeAttentionServes(static_cast<int>(c.num_heads),
                                        static_cast<int>(c.num_kv_heads),
                                        static_cast<int>(c.head_dim), /*max_blocks=*/1,
                                        /*block_size=*/32);
#endif
}

FusedDecoder::FusedDecoder(model::Transformer& model)
    : FusedDecoder(
          model->config(),
          [parameters = model->named_parameters()](const std::string& name) {
            const at::Tensor* found = parameters.find(name);
            return found != nullptr ? found->detach() : at::Tensor();
          },
          model->HeadWeight().detach(), nullptr) {}

FusedDecoder::FusedDecoder(const model::ModelConfig& config,
                           const std::map<std::string, at::Tensor>& slices,
                           parallel::Communicator& group)
    : FusedDecoder(
          config,
          [&slices](const std::string& name) {
            const auto found = slices.find(name);
            return found != slices.end() ? found->second.detach() : at::Tensor();
          },
          slices.at(config.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight")
              .detach(),
          &group) {}

FusedDecoder::FusedDecoder(const model::ModelConfig& config, const Lookup& get,
                           const at::Tensor& head, parallel::Communicator* group)
    : config_(config), group_(group), head_(head) {
  // The kernels read bf16 norm weights; loaded models keep theirs in float32 (model_loader.cc).
  const auto get_norm = [&](const std::string& name) {
    const at::Tensor weight = get(name);
    return weight.defined() ? weight.to(at::kBFloat16) : weight;
  };
  at::NoGradGuard no_grad;
  if (group_ != nullptr) {
    const int64_t tp = group_->size();
    config_.num_heads /= tp;
    config_.num_kv_heads /= tp;
    config_.intermediate_size /= tp;
  }
  embed_ = get("model.embed_tokens.weight");
  vocab_begin_ = group_ != nullptr ? group_->rank() * embed_.size(0) : 0;
  final_norm_ = get_norm("model.norm.weight");
  inv_freq_ = model::RopeInverseFrequencies(config_.rope, config_.head_dim).to(head_.device());
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    const std::string attention = p + "self_attn.", mlp = p + "mlp.";
    Layer layer;
    layer.input_norm = get_norm(p + "input_layernorm.weight");
    layer.post_norm = get_norm(p + "post_attention_layernorm.weight");
    layer.q_norm = get_norm(attention + "q_norm.weight");
    layer.k_norm = get_norm(attention + "k_norm.weight");
    layer.qkv_weight = Concat({get(attention + "q_proj.weight"), get(attention + "k_proj.weight"),
                               get(attention + "v_proj.weight")});
    layer.qkv_bias = Concat({get(attention + "q_proj.bias"), get(attention + "k_proj.bias"),
                             get(attention + "v_proj.bias")});
    layer.o_weight = get(attention + "o_proj.weight");
    layer.o_bias = get(attention + "o_proj.bias");
    layer.gate_up_weight = Concat({get(mlp + "gate_proj.weight"), get(mlp + "up_proj.weight")});
    layer.gate_up_bias = Concat({get(mlp + "gate_proj.bias"), get(mlp + "up_proj.bias")});
    layer.down_weight = get(mlp + "down_proj.weight");
    layer.down_bias = get(mlp + "down_proj.bias");
    layers_.push_back(std::move(layer));
  }
}

#if RLHFD_HAVE_CUDA

namespace {

at::Tensor Linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return bias.defined() ? at::addmm(bias, x, weight.t()) : at::mm(x, weight.t());
}

void SumOver(parallel::Communicator& group, const at::Tensor& tensor, const char* what) {
  const absl::Status status = group.AllReduceQueued(tensor, parallel::ReduceOp::kSum);
  TORCH_CHECK(status.ok(), "tensor-parallel decode: summing ", what,
              " over the group: ", std::string(status.message()));
}

}  // namespace

at::Tensor FusedDecoder::RowParallel(const at::Tensor& x, const at::Tensor& weight,
                                     const at::Tensor& bias) const {
  if (group_ == nullptr) return Linear(x, weight, bias);
  at::Tensor sum = at::mm(x, weight.t(), at::kFloat);
  SumOver(*group_, sum, "a row-parallel projection");
  if (bias.defined()) sum.add_(bias);
  return sum.to(at::kBFloat16);
}

at::Tensor FusedDecoder::Embed(const at::Tensor& tokens) const {
  if (group_ == nullptr) return at::embedding(embed_, tokens);
  at::Tensor rows = parallel::LocalEmbeddingRows(embed_, tokens, vocab_begin_);
  SumOver(*group_, rows, "the embedding");
  return rows;
}

at::Tensor FusedDecoder::Logits(const at::Tensor& hidden) const {
  const at::Tensor local = at::mm(hidden, head_.t(), at::kFloat);  // (B, V / tp)
  if (group_ == nullptr) return local;
  absl::StatusOr<at::Tensor> gathered = parallel::GatherVocabulary(*group_, local, /*queued=*/true);
  TORCH_CHECK(gathered.ok(), "tensor-parallel decode: gathering the logits: ",
              std::string(gathered.status().message()));
  return *std::move(gathered);
}

at::Tensor FusedDecoder::Layers(const at::Tensor& tokens, const at::Tensor& positions,
                                const at::Tensor& cache_rows, PagedKvCache& cache, bool keep_keys,
                                const AttendFn& attend) {
  const int64_t rows = tokens.size(0), hidden = config_.hidden_size;
  const int64_t heads = config_.num_heads, kv_heads = config_.num_kv_heads, d = config_.head_dim;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(tokens.device().index());
  const auto bf16 = head_.options();
  at::Tensor residual = at::empty({rows, hidden}, bf16.dtype(at::kFloat));
  at::Tensor h = at::empty({rows, hidden}, bf16);
  at::Tensor q = at::empty({rows, heads, d}, bf16);
  at::Tensor k = keep_keys ? at::empty({rows, kv_heads, d}, bf16) : at::Tensor();
  const at::Tensor embedded = Embed(tokens);  // (N, C) bf16
  // residual (+)= delta; h = norm(residual).
  const auto add_norm = [&](const at::Tensor& delta, bool assign, const at::Tensor& norm) {
    TORCH_CHECK(kernels::AddRmsNorm(residual.data_ptr<float>(), delta.data_ptr(), assign,
                                    norm.data_ptr(), h.data_ptr(), static_cast<int>(rows),
                                    static_cast<int>(hidden), eps, stream),
                "the fused norm kernel cannot take hidden size ", hidden,
                " or its inputs' alignment, or did not launch");
  };
  add_norm(embedded, /*assign=*/true, layers_[0].input_norm);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = layers_[i];
    const at::Tensor qkv = Linear(h, layer.qkv_weight, layer.qkv_bias);  // (N, (H + 2K) D)
    TORCH_CHECK(kernels::RopeAppend(qkv.data_ptr(), positions.data_ptr<int64_t>(),
                                    cache_rows.data_ptr<int64_t>(), inv_freq_.data_ptr<float>(),
                                    layer.q_norm.defined() ? layer.q_norm.data_ptr() : nullptr,
                                    layer.k_norm.defined() ? layer.k_norm.data_ptr() : nullptr, eps,
                                    q.data_ptr(), keep_keys ? k.data_ptr() : nullptr,
                                    cache.key(i).data_ptr(), cache.value(i).data_ptr(), rows, heads,
                                    kv_heads, d, static_cast<int>(cache.block_size()), stream),
                "the fused rotary kernel cannot take head dimension ", d, " or ", rows,
                " rows, or did not launch");
    const at::Tensor attention = attend(i, q, k, qkv);  // (N, H D)
    const at::Tensor o = RowParallel(attention, layer.o_weight, layer.o_bias);
    add_norm(o, /*assign=*/false, layer.post_norm);
    const at::Tensor gate_up = Linear(h, layer.gate_up_weight, layer.gate_up_bias);
    at::Tensor activated = at::empty({rows, gate_up.size(1) / 2}, bf16);
    TORCH_CHECK(
        kernels::SiluMul(gate_up.data_ptr(), activated.data_ptr(), rows, activated.size(1), stream),
        "the SiLU-up kernel did not launch for ", rows, " rows");
    const at::Tensor down = RowParallel(activated, layer.down_weight, layer.down_bias);
    const at::Tensor& next_norm = i + 1 < layers_.size() ? layers_[i + 1].input_norm : final_norm_;
    add_norm(down, /*assign=*/false, next_norm);
  }
  return h;  // (N, C) bf16, after the final norm.
}

at::Tensor FusedDecoder::Decode(const at::Tensor& tokens, const at::Tensor& positions,
                                const at::Tensor& block_tables, PagedKvCache& cache) {
  const int64_t rows = tokens.size(0), heads = config_.num_heads, d = config_.head_dim;
  const int64_t block_size = cache.block_size(), max_blocks = block_tables.size(1);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(tokens.device().index());
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  at::Tensor attention = at::empty({rows, heads * d}, head_.options());
  const at::Tensor workspace =
      at::empty({kernels::DecodeAttentionWorkspaceBytes(
                    static_cast<int>(rows), static_cast<int>(heads), static_cast<int>(d),
                    static_cast<int>(max_blocks * block_size))},
                head_.options().dtype(at::kByte));
  const auto attend = [&](size_t layer, const at::Tensor& q, const at::Tensor&, const at::Tensor&) {
    const bool served = kernels::DecodeAttention(
        q.data_ptr(), cache.key(layer).data_ptr(), cache.value(layer).data_ptr(),
        block_tables.data_ptr<int64_t>(), positions.data_ptr<int64_t>(), attention.data_ptr(),
        workspace.data_ptr(), rows, heads, config_.num_kv_heads, d, max_blocks, block_size, scale,
        stream);
    // Supports() admits only shapes the kernel serves; a mismatch or a failed launch must not
    // decode garbage.
    TORCH_CHECK(served, "the decode-attention kernel did not run for ", heads, " heads over ",
                config_.num_kv_heads, " key/value heads of size ", d, " (", rows,
                " rows): the shape is not served or its launch failed");
    return attention;
  };
  const at::Tensor cache_rows = PagedKvCache::CacheRows(block_tables, positions, block_size);
  const at::Tensor h = Layers(tokens, positions, cache_rows, cache, /*keep_keys=*/false, attend);
  return Logits(h);  // (B, V) float32
}

at::Tensor FusedDecoder::Prefill(const at::Tensor& ids, const at::Tensor& lengths,
                                 const at::Tensor& cache_rows,
                                 const std::optional<PrefillPast>& past, PagedKvCache& cache) {
  const int64_t batch = ids.size(0), t = ids.size(1), rows = batch * t;
  const int64_t heads = config_.num_heads, kv_heads = config_.num_kv_heads, d = config_.head_dim;
  const at::Tensor index = at::arange(t, lengths.options()).unsqueeze(0);  // (1, T)
  const at::Tensor real = index < lengths.unsqueeze(1);                    // (B, T)
  const at::Tensor positions = past ? past->positions.reshape({rows})
                                    : at::where(real, index, at::zeros_like(index)).reshape({rows});
  // Right padding: keys past a sequence's length are masked; a plain batch runs SDPA's causal
  // kernels unmasked.
  const bool ragged = !past && !real.all().item<bool>();
  at::Tensor mask;
  if (ragged) {
    const at::Tensor causal = index.view({t, 1}) >= index.view({1, t});  // (T, T) query ≥ key
    mask = causal.unsqueeze(0)
               .logical_and(real.unsqueeze(1))                       // (B, T, T)
               .logical_or(at::eye(t, real.options()).unsqueeze(0))  // Padding sees itself.
               .unsqueeze(1);
  }
  const auto attend = [&](size_t layer, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& qkv) {
    if (past) {  // Keys and values are in the cache by now (RopeAppend), the prefix's too.
      return PagedAttention(q.view({batch, t, heads, d}).transpose(1, 2), cache.key(layer),
                            cache.value(layer), past->block_tables, past->used_blocks,
                            past->positions, past->lengths)
          .transpose(1, 2)
          .reshape({rows, heads * d});
    }
    const at::Tensor v =
        qkv.view({batch, t, heads + 2 * kv_heads, d}).narrow(2, heads + kv_heads, kv_heads);
    const at::Tensor out = model::ScaledDotProductAttention(
        q.view({batch, t, heads, d}).transpose(1, 2),
        k.view({batch, t, kv_heads, d}).transpose(1, 2), v.transpose(1, 2), mask);  // (B, H, T, D)
    return out.transpose(1, 2).reshape({rows, heads * d});
  };
  const at::Tensor h = Layers(ids.reshape({rows}), positions, cache_rows.reshape({rows}), cache,
                              /*keep_keys=*/true, attend);
  const at::Tensor last = (at::arange(batch, lengths.options()) * t + lengths - 1);
  return Logits(h.index_select(0, last));  // (B, V) float32
}

#else  // Built without CUDA: Supports() is false and these are never called.

at::Tensor FusedDecoder::Decode(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                PagedKvCache&) {
  TORCH_CHECK(false, "FusedDecoder needs CUDA");
}
at::Tensor FusedDecoder::Prefill(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 const std::optional<PrefillPast>&, PagedKvCache&) {
  TORCH_CHECK(false, "FusedDecoder needs CUDA");
}

#endif

}  // namespace rlhfd::rollout
