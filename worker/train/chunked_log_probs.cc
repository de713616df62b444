// Chunked log-probs as a custom autograd function; see chunked_log_probs.h.
//
// For a chunk with logits z (n, V), p = softmax(z), L = logsumexp(z):
//   log p(t) = z_t - L                 d/dz = onehot(t) - p
//   H = L - Σ p·z                      d/dz = -p · (log p + H)
//
// On the GPU a forward that will be differentiated keeps a chunk's float32 logits for the
// backward while the device has room for them (KeepsLogits), so the backward's recompute GEMM
// runs only for the chunks it could not keep; the kept logits are the recomputed ones bit for bit
// (the same GEMM on the same inputs), so what is kept changes the speed, never the result.
#include "worker/train/chunked_log_probs.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>

#include <vector>

#if RLHFD_HAVE_CUDA
#include <c10/core/DeviceGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "worker/device/device_memory.h"
#include "worker/train/log_prob_kernels.h"
#endif

namespace rlhfd::train {
namespace {

at::ScalarType WideType(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// The GEMMs' input dtype: the autocast dtype inside an autocast region (training over float32
// masters), else the weight's own. Saved by the forward, so the backward (which runs outside
// the region) multiplies in the same dtype instead of falling back to float32 GEMMs.
at::ScalarType ComputeType(const at::Tensor& weight) {
  const at::DeviceType device = weight.device().type();
  return at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device)
                                                   : weight.scalar_type();
}

// a (m, k) x b (k, n) with float32 (or float64) output: on the GPU with a narrow compute dtype,
// the inputs are rounded to it and cuBLAS accumulates in float32.
at::Tensor WideMatmul(const at::Tensor& a, const at::Tensor& b, at::ScalarType compute) {
  const at::ScalarType wide = compute == at::kDouble ? at::kDouble : at::kFloat;
  if (a.is_cuda() && compute != wide) return at::mm(a.to(compute), b.to(compute), wide);
  return at::mm(a.to(wide), b.to(wide));
}

// Whether the fused kernels take a chunk: float32 logits on the GPU (float64 and the CPU run the
// tensor operations below).
bool Fused(const at::Tensor& hidden, at::ScalarType wide) {
#if RLHFD_HAVE_CUDA
  return hidden.is_cuda() && wide == at::kFloat;
#else
  return false;
#endif
}

// Logits of hidden rows [begin, begin + n) in the wide dtype: (n, V).
at::Tensor ChunkLogits(const at::Tensor& hidden, const at::Tensor& weight, int64_t begin, int64_t n,
                       at::ScalarType compute) {
  return WideMatmul(hidden.narrow(0, begin, n), weight.t(), compute);
}

#if RLHFD_HAVE_CUDA
// Whether `bytes` more may stay allocated on the current device until the backward: what the
// device and the caching allocator have free less `bytes` still leaves a quarter of the device
// for the rest of the forward and the backward.
bool KeepsLogits(int64_t bytes) {
  const worker::DeviceMemory memory = worker::QueryDeviceMemory(at::Device(at::kCUDA));
  return memory.free_bytes - bytes >= memory.total_bytes / 4;
}

model::kernels::ElementType GradientTypeOf(at::ScalarType compute) {
  switch (compute) {
    case at::kBFloat16:
      return model::kernels::ElementType::kBFloat16;
    case at::kHalf:
      return model::kernels::ElementType::kFloat16;
    default:
      return model::kernels::ElementType::kFloat32;
  }
}
#endif

class ChunkedLogProbsFunction : public torch::autograd::Function<ChunkedLogProbsFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& hidden, const at::Tensor& weight,
                                                const at::Tensor& targets, int64_t chunk,
                                                bool differentiated) {
    const int64_t n = hidden.size(0);
    const at::ScalarType compute = ComputeType(weight);
    // One cast of the weight for all chunks (autocast would cast it per GEMM).
    const at::Tensor weight_compute = weight.to(compute);
    at::Tensor log_prob = at::empty({n}, hidden.options().dtype(WideType(weight)));
    at::Tensor entropy = at::empty_like(log_prob);
    at::Tensor lse = at::empty_like(log_prob);
    [[maybe_unused]] const bool fused = Fused(hidden, log_prob.scalar_type());
#if RLHFD_HAVE_CUDA
    // The kernels launch on the current device: make it the tensors' (as LibTorch's ops do).
    const c10::OptionalDeviceGuard device_guard(hidden.device());
#endif
    const at::Tensor targets_here = targets.to(hidden.device(), at::kLong).contiguous();
    // Per chunk its logits, or undefined where the backward recomputes them.
    std::vector<at::Tensor> kept;
    for (int64_t begin = 0; begin < n; begin += chunk) {
      const int64_t size = std::min(chunk, n - begin);
      const at::Tensor z = ChunkLogits(hidden, weight_compute, begin, size, compute);  // (n, V)
#if RLHFD_HAVE_CUDA
      if (fused) {
        kept.push_back(differentiated && KeepsLogits(z.nbytes()) ? z : at::Tensor());
        TORCH_CHECK(kernels::LogProbRows(
                        z.contiguous().data_ptr<float>(), static_cast<int>(size),
                        static_cast<int>(z.size(1)), targets_here.data_ptr<int64_t>() + begin,
                        log_prob.data_ptr<float>() + begin, entropy.data_ptr<float>() + begin,
                        lse.data_ptr<float>() + begin,
                        c10::cuda::getCurrentCUDAStream(hidden.device().index())),
                    "the log-prob kernel did not launch for ", size, " rows");
        continue;
      }
#endif
      const at::Tensor chunk_lse = at::logsumexp(z, -1);
      const at::Tensor p = at::softmax(z, -1);
      log_prob.narrow(0, begin, size)
          .copy_(z.gather(-1, targets_here.narrow(0, begin, size).unsqueeze(-1)).squeeze(-1) -
                 chunk_lse);
      entropy.narrow(0, begin, size).copy_(chunk_lse - (p * z).sum(-1));
      lse.narrow(0, begin, size).copy_(chunk_lse);
    }
    ctx->save_for_backward({hidden, weight, targets_here, entropy, lse});
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["compute"] = compute;
    if (!kept.empty()) ctx->saved_data["logits"] = kept;
    return {log_prob, entropy};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& hidden = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& targets = saved[2];
    const at::Tensor& entropy = saved[3];
    const at::Tensor& lse = saved[4];
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const int64_t n = hidden.size(0);
    const at::ScalarType wide = WideType(weight);
    const at::Tensor g_lp =
        grads[0].defined() ? grads[0].to(wide).contiguous() : at::zeros({n}, entropy.options());
    const at::Tensor g_h =
        grads[1].defined() ? grads[1].to(wide).contiguous() : at::zeros({n}, entropy.options());
    at::Tensor grad_hidden = at::empty(hidden.sizes(), hidden.options());
    at::Tensor grad_weight = at::zeros(weight.sizes(), weight.options().dtype(wide));
    const at::ScalarType compute = ctx->saved_data["compute"].toScalarType();
    const at::Tensor weight_compute = weight.to(compute);
    [[maybe_unused]] const bool fused = Fused(hidden, wide);
#if RLHFD_HAVE_CUDA
    const c10::OptionalDeviceGuard device_guard(hidden.device());
#endif
    // Taken out of the context, so each chunk's logits are freed once used (a second backward
    // through a retained graph recomputes them all).
    std::vector<at::Tensor> kept;
    if (const auto it = ctx->saved_data.find("logits"); it != ctx->saved_data.end()) {
      kept = it->second.toTensorVector();
      ctx->saved_data.erase(it);
    }
    for (int64_t begin = 0, index = 0; begin < n; begin += chunk, ++index) {
      const int64_t size = std::min(chunk, n - begin);
      at::Tensor z;
      if (index < static_cast<int64_t>(kept.size())) z = std::move(kept[index]);
      if (!z.defined()) z = ChunkLogits(hidden, weight_compute, begin, size, compute);
      at::Tensor grad_z;
#if RLHFD_HAVE_CUDA
      if (fused) {
        // Written in the GEMMs' dtype, so neither product below casts it again.
        grad_z = at::empty(z.sizes(), z.options().dtype(compute));
        TORCH_CHECK(
            kernels::LogProbGradient(
                z.contiguous().data_ptr<float>(), static_cast<int>(size),
                static_cast<int>(z.size(1)), targets.data_ptr<int64_t>() + begin,
                lse.data_ptr<float>() + begin, entropy.data_ptr<float>() + begin,
                g_lp.data_ptr<float>() + begin, g_h.data_ptr<float>() + begin, grad_z.data_ptr(),
                GradientTypeOf(compute), c10::cuda::getCurrentCUDAStream(hidden.device().index())),
            "the log-prob gradient kernel did not launch for ", size, " rows");
      }
#endif
      if (!grad_z.defined()) {
        const at::Tensor log_p = at::log_softmax(z, -1);
        const at::Tensor p = log_p.exp();
        grad_z = -p * (g_lp.narrow(0, begin, size).unsqueeze(-1) +
                       g_h.narrow(0, begin, size).unsqueeze(-1) *
                           (log_p + entropy.narrow(0, begin, size).unsqueeze(-1)));
        grad_z.scatter_add_(-1, targets.narrow(0, begin, size).unsqueeze(-1),
                            g_lp.narrow(0, begin, size).unsqueeze(-1));
      }
      grad_hidden.narrow(0, begin, size).copy_(WideMatmul(grad_z, weight_compute, compute));
      grad_weight.add_(WideMatmul(grad_z.t(), hidden.narrow(0, begin, size), compute));
    }
    return {grad_hidden, grad_weight.to(weight.scalar_type()), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor TemperatureScaled(const at::Tensor& hidden, double temperature) {
  return temperature == 1.0 ? hidden : hidden / temperature;
}

std::pair<at::Tensor, at::Tensor> ChunkedLogProbs(const at::Tensor& hidden,
                                                  const at::Tensor& weight,
                                                  const at::Tensor& targets, int64_t chunk) {
  // Inside the function's forward gradients are off: whether a backward will follow is known here.
  const bool differentiated =
      at::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  auto out = ChunkedLogProbsFunction::apply(hidden, weight, targets, std::max<int64_t>(chunk, 1),
                                            differentiated);
  return {out[0], out[1]};
}

}  // namespace rlhfd::train
