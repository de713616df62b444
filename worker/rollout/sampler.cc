#include "worker/rollout/sampler.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>

#include "worker/rollout/sampling_math.h"
#if RLHFD_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>

#include "worker/rollout/kernels.h"
#endif

namespace rlhfd::rollout {
namespace {

// The CPU twin of kernels::SampleRows (same arithmetic, so the same draws up to float rounding).
void SampleRowsOnCpu(const at::Tensor& logits, const SamplingRows& rows, const at::Tensor& tokens,
                     const at::Tensor& logprobs) {
  const int64_t vocab = logits.size(1);
  const float* x_all = logits.data_ptr<float>();
  const float* temperature = rows.temperature.data_ptr<float>();
  const int64_t* seeds = rows.seeds.data_ptr<int64_t>();
  const int64_t* counters = rows.counters.data_ptr<int64_t>();
  int64_t* token_out = tokens.data_ptr<int64_t>();
  float* logprob_out = logprobs.data_ptr<float>();
  at::parallel_for(0, logits.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const float* x = x_all + row * logits.stride(0);
      const bool greedy = !(temperature[row] > 0.f);
      const float inverse_t = greedy ? 1.f : 1.f / temperature[row];
      const uint64_t key =
          DrawKey(static_cast<uint64_t>(seeds[row]), static_cast<uint64_t>(counters[row]));
      float max = -INFINITY, sum = 0.f, best = -INFINITY;
      int64_t best_index = vocab;
      for (int64_t v = 0; v < vocab; ++v) {
        const float z = x[v] * inverse_t;
        if (z == -INFINITY) continue;
        if (z > max) {
          sum = sum * std::exp(max - z) + 1.f;
          max = z;
        } else {
          sum += std::exp(z - max);
        }
        const float draw = greedy ? z : z + Gumbel(key, static_cast<uint32_t>(v));
        if (draw > best) {
          best = draw;
          best_index = v;
        }
      }
      if (best_index >= vocab) {
        token_out[row] = 0;
        logprob_out[row] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      token_out[row] = best_index;
      logprob_out[row] = x[best_index] * inverse_t - max - std::log(sum);
    }
  });
}

}  // namespace

at::Tensor FilterTopKTopP(const at::Tensor& logits, const at::Tensor& temperature,
                          const at::Tensor& top_k, const at::Tensor& top_p) {
  const int64_t vocab = logits.size(1);
  // Greedy rows (temperature 0) keep their argmax under any filter; divide them by 1.
  const at::Tensor t = at::where(temperature > 0, temperature, at::ones_like(temperature));
  const at::Tensor z = logits.to(at::kFloat) / t.unsqueeze(1);
  auto [sorted, order] = z.sort(/*dim=*/-1, /*descending=*/true);
  const at::Tensor rank = at::arange(vocab, top_k.options()).unsqueeze(0);
  const at::Tensor k = at::where(top_k > 0, top_k, at::full_like(top_k, vocab));
  at::Tensor remove = rank >= k.unsqueeze(1);
  // top-p on what top-k kept, renormalised: drop a token when the tokens ranked above it
  // already hold top_p of the mass. The first token is never dropped (nothing is above it).
  const at::Tensor probs = at::softmax(sorted.masked_fill(remove, -INFINITY), -1);
  const at::Tensor mass_above = probs.cumsum(-1) - probs;
  // Rows with top_p = 1 skip it: rounding can push the mass above the last tokens to 1.
  remove =
      remove.logical_or((mass_above >= top_p.unsqueeze(1)).logical_and((top_p < 1).unsqueeze(1)));
  const at::Tensor drop = at::zeros_like(remove).scatter(1, order, remove);
  return logits.masked_fill(drop, -INFINITY);
}

SampledTokens SampleTokens(const at::Tensor& logits, const SamplingRows& rows) {
  TORCH_CHECK(logits.dim() == 2, "SampleTokens: logits must be (B, V)");
  at::Tensor x = logits;
  if (rows.top_k.defined()) x = FilterTopKTopP(x, rows.temperature, rows.top_k, rows.top_p);
  x = x.to(at::kFloat);
  if (x.stride(1) != 1) x = x.contiguous();
  const int64_t batch = x.size(0);
  const auto long_options = x.options().dtype(at::kLong);
  SampledTokens out{at::empty({batch}, long_options), at::empty({batch}, x.options())};
  const at::Tensor temperature = rows.temperature.to(at::kFloat).contiguous();
  const at::Tensor seeds = rows.seeds.contiguous(), counters = rows.counters.contiguous();
#if RLHFD_HAVE_CUDA
  if (x.is_cuda()) {
    const at::Tensor workspace = at::empty(
        {kernels::SampleRowsWorkspaceBytes(static_cast<int>(batch))}, x.options().dtype(at::kByte));
    TORCH_CHECK(
        kernels::SampleRows(
            x.data_ptr<float>(), x.stride(0), static_cast<int>(batch), static_cast<int>(x.size(1)),
            temperature.data_ptr<float>(), seeds.data_ptr<int64_t>(), counters.data_ptr<int64_t>(),
            out.tokens.data_ptr<int64_t>(), out.logprobs.data_ptr<float>(), workspace.data_ptr(),
            c10::cuda::getCurrentCUDAStream(x.device().index())),
        "the sampling kernels did not launch for ", batch, " rows of ", x.size(1), " logits");
    return out;
  }
#endif
  TORCH_CHECK(x.is_cpu(), "SampleTokens: logits on an unsupported device");
  SampleRowsOnCpu(x, {temperature, seeds, counters, {}, {}}, out.tokens, out.logprobs);
  return out;
}

}  // namespace rlhfd::rollout
