// [gpu] The rollout engine's CUDA path: the decode-attention kernel (paged, shuffled blocks)
// against ATen's attention, the decode step's norm and SiLU·up kernels against float64, the
// sampling kernel against its CPU twin (NaN logits too), greedy bf16 generation
// (with CUDA graphs, with and without preemption, after cached prefixes) against the model's own
// full forward, graphs against eager decoding, a GRPO group's shared prefill, and memory
// returned on release.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/types.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <iostream>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/support/random_decoder.h"
#include "worker/device/device_memory.h"
#include "worker/model/model_loader.h"
#include "worker/model/transformer.h"
#include "worker/rollout/decode_attention.h"
#include "worker/rollout/device_support.h"
#include "worker/rollout/engine.h"
#include "worker/rollout/fused_decoder.h"
#include "worker/rollout/kernels.h"
#include "worker/rollout/sampler.h"

namespace rlhfd::rollout {
namespace {

const at::Device kGpu(at::kCUDA, 0);

// Random-initialised models the fused decode path serves, small enough to be quick: a Qwen2-like
// one (q/k/v bias, head dim 64, 7 query heads per key/value head) and a Qwen3-like one (q/k
// RMSNorm, no bias, head dim 128).
model::Transformer SmallModel(bool qwen3 = false) {
  return testing::RandomDecoder(qwen3, 448, qwen3 ? 8 : 7, qwen3 ? 2 : 1, kGpu);
}

std::vector<GenerationRequest> Prompts(int count, int64_t max_new_tokens) {
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < count; ++i) {
    GenerationRequest request;
    for (int t = 0; t < 5 + (i * 7) % 40; ++t)
      request.prompt_ids.push_back((i * 131 + t * 17) % 2048);
    request.sampling.temperature = 0;
    request.sampling.max_new_tokens = max_new_tokens;
    request.sampling.ignore_eos = true;
    requests.push_back(request);
  }
  return requests;
}

// Each sample of `results` (24 greedy tokens) against the model's own full bf16 forward over its
// prompt and response: the chosen token is the argmax up to bf16 noise, and its log-prob that of
// the forward. Both sides are bf16 forwards that round differently: the module keeps GEMM
// outputs in float32, the fused engine rounds them to bf16 (as vLLM does). Measured on the H200:
// argmax gaps up to 0.044 and log-prob differences up to 0.052 (mean ~0.01); a wrong kernel gives
// differences of order 1.
void CheckAgainstFullForward(model::Transformer& model,
                             const std::vector<GenerationRequest>& requests,
                             const std::vector<GenerationResult>& results,
                             const std::string& label) {
  double worst_gap = 0, worst_logprob = 0, total_logprob_diff = 0;
  int64_t tokens = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const Completion& sample = results[i].samples[0];
    REQUIRE(sample.token_ids.size() == 24);
    std::vector<int64_t> ids = requests[i].prompt_ids;
    ids.insert(ids.end(), sample.token_ids.begin(), sample.token_ids.end());
    const int64_t prompt = static_cast<int64_t>(requests[i].prompt_ids.size());
    at::Tensor logits =
        model->Logits(model->Hidden({at::tensor(ids).unsqueeze(0).to(kGpu)}))[0].to(at::kFloat);
    logits = logits.narrow(0, prompt - 1, 24).cpu();
    const at::Tensor chosen = at::tensor(sample.token_ids).unsqueeze(1);
    const double gap = (logits.amax(1) - logits.gather(1, chosen).squeeze(1)).max().item<double>();
    const at::Tensor logprob_diff =
        (at::log_softmax(logits, -1).gather(1, chosen).squeeze(1) - at::tensor(sample.logprobs))
            .abs();
    worst_gap = std::max(worst_gap, gap);
    worst_logprob = std::max(worst_logprob, logprob_diff.max().item<double>());
    total_logprob_diff += logprob_diff.sum().item<double>();
    tokens += logprob_diff.numel();
  }
  std::cout << "rollout_gpu: " << label << ", greedy vs full forward: worst argmax gap "
            << worst_gap << ", log-prob diff worst " << worst_logprob << " mean "
            << total_logprob_diff / tokens << "\n";
  CHECK(worst_gap < 0.1);
  CHECK(worst_logprob < 0.1);
  CHECK(total_logprob_diff / tokens < 0.02);
}

}  // namespace

// A worker asks for the device's memory before anything has touched the GPU, and its job's
// device is "cuda" with no index when the config says `trainer.device: cuda`: the figures are
// then the current device's (they once threw "Invalid device argument": the caching allocator
// was not initialised yet). Declared first, so that it runs before anything in this process has
// used the GPU (Catch2 runs test cases in declaration order).
TEST_CASE("device memory figures of 'cuda' without an index are the current device's",
          "[gpu][rollout]") {
  const at::Device any_cuda(at::kCUDA);
  CHECK(worker::BytesInUse(any_cuda) == 0);
  worker::ResetPeakMemory(any_cuda);
  const at::Tensor held = at::empty({64 << 20}, at::TensorOptions().dtype(at::kByte).device(kGpu));
  const worker::DeviceMemory memory = worker::QueryDeviceMemory(any_cuda);
  CHECK(memory.allocated_bytes >= static_cast<int64_t>(held.nbytes()));
  CHECK(memory.peak_allocated_bytes >= memory.allocated_bytes);
  CHECK(memory.total_bytes >= memory.free_bytes);
  CHECK(memory.allocated_bytes == worker::QueryDeviceMemory(kGpu).allocated_bytes);
  CHECK(worker::BytesInUse(any_cuda) == memory.allocated_bytes);
  CHECK(DeviceName(any_cuda) == DeviceName(kGpu));
}

TEST_CASE("decode-attention kernel matches ATen's attention", "[gpu][rollout]") {
  torch::NoGradGuard no_grad;
  // Query groups of 7, 1, 8, 12 and 16 heads per key/value head at both head sizes (12: the MMA's
  // upper rows only partly real); a few rows and many (more than a wave of warps) on caches of
  // spans of 128 keys, and a long cache (spans longer than 128 keys); blocks of 32, 64 and 128
  // positions, each sequence's blocks shuffled over the cache.
  for (auto [heads, kv_heads, head_dim] :
       {std::tuple{14, 2, 64}, std::tuple{28, 4, 128}, std::tuple{8, 8, 64}, std::tuple{32, 4, 128},
        std::tuple{32, 2, 64}, std::tuple{24, 2, 64}, std::tuple{48, 4, 128},
        std::tuple{64, 4, 128}}) {
    for (auto [batch, capacity, block_size] :
         {std::tuple{9, 700, 32}, std::tuple{300, 520, 32}, std::tuple{9, 4500, 32},
          std::tuple{9, 700, 128}, std::tuple{300, 520, 64}}) {
      INFO("heads " << heads << " kv_heads " << kv_heads << " head_dim " << head_dim << " batch "
                    << batch << " capacity " << capacity << " block size " << block_size);
      const int64_t max_blocks = (capacity + block_size - 1) / block_size;
      const auto bf16 = at::TensorOptions().dtype(at::kBFloat16).device(kGpu);
      const auto longs = at::TensorOptions().dtype(at::kLong).device(kGpu);
      // Lengths 1 .. capacity: the shortest, the longest, both sides of a 32-key chunk and of a
      // 128-key span, the rest drawn.
      at::Tensor positions = at::randint(0, capacity, {batch}, longs);
      const int64_t fixed[] = {0, capacity - 1, 31, 32, 127, 128, 129};
      for (int64_t i = 0; i < 7; ++i) positions[i].fill_(fixed[i]);
      // Each sequence's keys and values, then scattered over the cache's blocks in a shuffled
      // order (a few blocks more than the sequences hold). Keys and values past each sequence's
      // length are NaN: what an unwritten cache may hold must not reach the output.
      constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
      const int64_t padded = max_blocks * block_size;
      const at::Tensor unwritten = (at::arange(padded, longs).unsqueeze(0) > positions.unsqueeze(1))
                                       .view({batch, 1, padded, 1});
      const auto sequences = [&] {
        return at::randn({batch, kv_heads, padded, head_dim}, bf16).masked_fill(unwritten, kNan);
      };
      const at::Tensor tables = at::randperm(batch * max_blocks + 3, longs)
                                    .narrow(0, 0, batch * max_blocks)
                                    .view({batch, max_blocks});
      const auto paged = [&](const at::Tensor& dense) {
        at::Tensor cache =
            at::full({batch * max_blocks + 3, kv_heads, block_size, head_dim}, kNan, bf16);
        cache.index_copy_(0, tables.reshape({-1}),
                          dense.view({batch, kv_heads, max_blocks, block_size, head_dim})
                              .transpose(1, 2)
                              .reshape({batch * max_blocks, kv_heads, block_size, head_dim}));
        return cache;
      };
      const at::Tensor k_cache = paged(sequences()), v_cache = paged(sequences());
      const at::Tensor q = at::randn({batch, heads, 1, head_dim}, bf16);
      const at::Tensor out = DecodeAttention(q, k_cache, v_cache, tables, positions);
      const at::Tensor expected = DecodeAttentionReference(
          q.to(at::kFloat), at::nan_to_num(k_cache.to(at::kFloat), 0, 0, 0),
          at::nan_to_num(v_cache.to(at::kFloat), 0, 0, 0), tables, positions);
      const at::Tensor diff = (out.to(at::kFloat) - expected).abs();
      const double max_diff = diff.max().item<double>();
      // Against each output row's size: a long row averages many values, so its outputs are
      // small (about 1/sqrt(length)) and an absolute bound alone would miss a wrong span there.
      const at::Tensor row_rms = expected.pow(2).mean(-1, /*keepdim=*/true).sqrt();
      const double max_relative = (diff / (row_rms + 1e-3)).max().item<double>();
      std::cout << "rollout_gpu: decode attention H=" << heads << " K=" << kv_heads
                << " D=" << head_dim << " B=" << batch << " capacity " << capacity << " block "
                << block_size << " max |diff| vs fp32 " << max_diff
                << ", relative to the row's rms " << max_relative << "\n";
      // bf16 rounding of the output (values of magnitude ~1) and of the softmax weights.
      CHECK(max_diff < 2e-2);
      CHECK(max_relative < 0.05);
    }
  }
}

// The decode step's residual add + RMSNorm and SiLU·up against float64: hidden sizes that fill a
// thread's four-column groups once (896, 100: a block of one warp), several times (3584, 16384)
// and partly (5120: five groups where eight are held), rows from one to more than a wave; MLP
// widths that take 16-byte vectors (4864, 8) and only pairs (10), and rows that are not 16-byte
// aligned (pairs again), and 70,000 rows (more than a grid has rows of blocks). What the norm
// cannot take it refuses rather than computes wrongly.
TEST_CASE("the decode step's norm and SiLU-up kernels equal float64 up to bf16 rounding",
          "[gpu][rollout]") {
  torch::NoGradGuard no_grad;
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16).device(kGpu);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(0);
  constexpr int64_t kGuard = 64;  // Elements past each output, which must stay untouched.
  // The first `count` elements of a buffer with a guard region after them.
  const auto guarded = [&](at::Tensor storage, int64_t rows, int64_t columns) {
    return storage.narrow(0, 0, rows * columns).view({rows, columns});
  };
  const auto guard_intact = [&](const at::Tensor& storage, double value) {
    return storage.narrow(0, storage.size(0) - kGuard, kGuard).eq(value).all().item<bool>();
  };
  for (int hidden : {896, 100, 3584, 16384, 5120}) {
    for (int rows : {1, 7, 300}) {
      for (bool assign : {false, true}) {
        INFO("hidden " << hidden << " rows " << rows << " assign " << assign);
        at::Tensor residual_storage = at::full({rows * hidden + kGuard}, 5, bf16.dtype(at::kFloat));
        at::Tensor residual = guarded(residual_storage, rows, hidden);
        residual.copy_(at::randn({rows, hidden}, bf16.dtype(at::kFloat)) * 3);
        const at::Tensor delta = at::randn({rows, hidden}, bf16);
        const at::Tensor weight = at::randn({hidden}, bf16);
        at::Tensor out_storage = at::full({rows * hidden + kGuard}, 5, bf16);
        const at::Tensor out = guarded(out_storage, rows, hidden);
        const at::Tensor sum =
            (assign ? at::zeros_like(residual) : residual).to(at::kDouble) + delta.to(at::kDouble);
        const at::Tensor expected =
            weight.to(at::kDouble) * sum * at::rsqrt(sum.pow(2).mean(-1, true) + 1e-6);
        REQUIRE(kernels::AddRmsNorm(residual.data_ptr<float>(), delta.data_ptr(), assign,
                                    weight.data_ptr(), out.data_ptr(), rows, hidden, 1e-6f,
                                    stream));
        // float32 sums of values below ~25: within a float32 rounding (2^-20 there).
        CHECK((residual.to(at::kDouble) - sum).abs().max().item<double>() <= 1e-5);
        // One bf16 rounding of the output (2^-8 relative) and float32 arithmetic before it.
        const at::Tensor got = out.to(at::kDouble);
        CHECK(((got - expected).abs() / (expected.abs() + 1e-3)).max().item<double>() <= 4.1e-3);
        // The scale, over every row: the output's rounding averages out (each row's estimate has a
        // spread of about 4.8e-3 / sqrt(hidden): relative errors of ~1.6e-3, weighted by values
        // whose fourth moment is 9), a column group missing from the sum of squares does not
        // (+2 / hidden in every row: 1.2e-4 at 16,384, nine times the bound there at 300 rows).
        const at::Tensor row_scale = (got * expected).sum(-1) / expected.pow(2).sum(-1) - 1;
        CHECK(std::abs(row_scale.mean().item<double>()) <= 3e-2 / std::sqrt(hidden * rows));
        CHECK(guard_intact(residual_storage, 5));
        CHECK(guard_intact(out_storage, 5));
      }
    }
  }
  at::Tensor residual = at::zeros({4, 98}, bf16.dtype(at::kFloat));
  const at::Tensor delta = at::zeros({4, 98}, bf16), out = at::empty({4, 98}, bf16);
  CHECK_FALSE(kernels::AddRmsNorm(residual.data_ptr<float>(), delta.data_ptr(), false,
                                  delta.data_ptr(), out.data_ptr(), 4, 98, 1e-6f, stream));
  CHECK_FALSE(kernels::AddRmsNorm(residual.data_ptr<float>() + 1, delta.data_ptr(), false,
                                  delta.data_ptr(), out.data_ptr(), 1, 96, 1e-6f, stream));

  for (auto [width, offset] :
       {std::pair{4864, 0}, std::pair{8, 0}, std::pair{10, 0}, std::pair{4864, 2}}) {
    // 70,000 rows: more than a grid's 65,535 rows of blocks (a long prefill).
    for (int rows : {1, 300, 70000}) {
      if (rows > 300 && width > 16) continue;
      INFO("width " << width << " rows " << rows << " offset " << offset);
      const at::Tensor storage = at::randn({rows * 2 * width + offset}, bf16) * 4;
      const at::Tensor gate_up =
          storage.narrow(0, offset, rows * 2 * width).view({rows, 2 * width});
      at::Tensor out_storage = at::full({rows * width + offset + kGuard}, 7, bf16);
      const at::Tensor out = out_storage.narrow(0, offset, rows * width).view({rows, width});
      REQUIRE(kernels::SiluMul(gate_up.data_ptr(), out.data_ptr(), rows, width, stream));
      const at::Tensor gate = gate_up.narrow(1, 0, width).to(at::kDouble);
      const at::Tensor up = gate_up.narrow(1, width, width).to(at::kDouble);
      const at::Tensor expected = gate * at::sigmoid(gate) * up;
      const double error =
          ((out.to(at::kDouble) - expected).abs() / (expected.abs() + 1e-3)).max().item<double>();
      CHECK(error <= 4.1e-3);
      CHECK(out_storage.narrow(0, 0, offset).eq(7).all().item<bool>());
      CHECK(guard_intact(out_storage, 7));
    }
  }
}

// The kernel skips the noise of logits that cannot win (their logit plus a bound of the noise
// below the best draw so far); the CPU sampler draws every logit's noise. Equal tokens show the
// skipping exact: small vocabularies (5,000; 1,001, whose rows are not 16-byte aligned and end
// mid-quad: the scalar loads; 100, which leaves 7 of a row's 32 splits empty), and Qwen's
// 151,936 with logits as spread as a random model's (0.6: the skip decided by the random bits),
// a spread of 3, and a trained model's (most logits far below the best: skipped by the logit
// alone), some rows top-k filtered (-inf) and some greedy.
TEST_CASE("sampling kernel draws what the CPU sampler draws", "[gpu][rollout]") {
  const auto [rows, vocab, spread] = GENERATE(std::make_tuple(int64_t{512}, int64_t{5000}, 3.0),
                                              std::make_tuple(int64_t{64}, int64_t{1001}, 3.0),
                                              std::make_tuple(int64_t{64}, int64_t{100}, 3.0),
                                              std::make_tuple(int64_t{96}, int64_t{151936}, 0.6),
                                              std::make_tuple(int64_t{96}, int64_t{151936}, 3.0),
                                              std::make_tuple(int64_t{96}, int64_t{151936}, 12.0));
  INFO("rows " << rows << ", vocabulary " << vocab << ", spread " << spread);
  at::manual_seed(19);
  at::Tensor logits = at::randn({rows, vocab}) * spread;
  // Rows 32-39 keep their 50 largest logits, as top-k leaves them.
  const at::Tensor kth = std::get<0>(logits.narrow(0, 32, 8).topk(50, -1)).narrow(1, 49, 1);
  logits.narrow(0, 32, 8).masked_fill_(logits.narrow(0, 32, 8) < kth, -INFINITY);
  SamplingRows cpu_rows{at::rand({rows}) * 1.5, at::randint(0, 1 << 30, {rows}, at::kLong),
                        at::randint(0, 100, {rows}, at::kLong)};
  cpu_rows.temperature.narrow(0, 0, 16).zero_();  // Some greedy rows.
  const SampledTokens cpu = SampleTokens(logits, cpu_rows);
  SamplingRows gpu_rows{cpu_rows.temperature.to(kGpu), cpu_rows.seeds.to(kGpu),
                        cpu_rows.counters.to(kGpu)};
  const SampledTokens gpu = SampleTokens(logits.to(kGpu), gpu_rows);
  CHECK(at::equal(gpu.tokens.cpu(), cpu.tokens));
  // The drawn token's log-probability against float64 (the CPU twin's float32 sum runs over the
  // vocabulary in order, 151,936 terms, too far from exact to judge by). The kernel's float32
  // log-sum-exp of z = logits / T is off by rounding, which grows with |z| (T down to ~0 makes |z|
  // large): a few float32 epsilons of the row's largest |z|.
  const at::Tensor t =
      at::where(cpu_rows.temperature > 0, cpu_rows.temperature, at::ones_like(cpu_rows.temperature))
          .unsqueeze(1)
          .to(at::kDouble);
  const at::Tensor z = logits.to(at::kDouble) / t;
  const at::Tensor expected = z.gather(1, cpu.tokens.unsqueeze(1)).squeeze(1) - at::logsumexp(z, 1);
  const at::Tensor scale = at::where(at::isfinite(z), z, at::zeros_like(z)).abs().amax(1);
  const at::Tensor allowed = 4 * std::numeric_limits<float>::epsilon() * scale + 1e-5;
  const at::Tensor error = (gpu.logprobs.cpu().to(at::kDouble) - expected).abs();
  std::cout << "rollout_gpu: sampling " << rows << " x " << vocab << ", spread " << spread
            << ": worst log-prob error " << error.max().item<double>() << "\n";
  CHECK((error <= allowed).all().item<bool>());
}

// A NaN logit makes the drawn token's log-prob NaN on the GPU as on the CPU, wherever it lies:
// among finite logits, in a split of the kernel whose other logits are all -inf (top-k filtered:
// NaN is never a split's max, so that split's sum once dropped out of the row's), and in a row of
// NaN alone; the token is the draw over the other logits either way.
TEST_CASE("a NaN logit makes the sampled log-prob NaN on the GPU as on the CPU", "[gpu][rollout]") {
  constexpr int64_t kVocab = 5000;  // 32 splits of 160 logits in the kernel.
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  at::manual_seed(23);
  at::Tensor logits = at::full({4, kVocab}, -INFINITY);
  logits[0].narrow(0, 0, 10).copy_(at::randn({10}));  // Top-k kept ten logits in split 0,
  logits[0][4000] = kNan;                             // and a NaN in split 25.
  logits[1].copy_(at::randn({kVocab}));
  logits[1][2500] = kNan;                             // Among finite logits.
  logits[2].fill_(kNan);                              // Nothing to draw from.
  logits[3].narrow(0, 0, 10).copy_(at::randn({10}));  // The control: no NaN.
  for (float temperature : {0.f, 1.f}) {
    INFO("temperature " << temperature);
    SamplingRows cpu_rows{at::full({4}, temperature), at::arange(4, at::kLong) + 7,
                          at::zeros({4}, at::kLong)};
    const SampledTokens cpu = SampleTokens(logits, cpu_rows);
    const SampledTokens gpu = SampleTokens(
        logits.to(kGpu),
        {cpu_rows.temperature.to(kGpu), cpu_rows.seeds.to(kGpu), cpu_rows.counters.to(kGpu)});
    CHECK(at::equal(gpu.tokens.cpu(), cpu.tokens));
    const at::Tensor gpu_logprobs = gpu.logprobs.cpu();
    CHECK(at::equal(at::isnan(gpu_logprobs), at::isnan(cpu.logprobs)));
    CHECK(at::isnan(gpu_logprobs).narrow(0, 0, 3).all().item<bool>());
    CHECK(std::abs(gpu_logprobs[3].item<float>() - cpu.logprobs[3].item<float>()) < 1e-5);
  }
}

// Prompts of 5-44 tokens and 24 new ones cross blocks of 32 positions mid-decode (table entries
// written on the device between graph replays). With 20 blocks for 24 rows the cache runs out:
// sequences are preempted and prefilled again, and must still follow the full forward.
TEST_CASE("bf16 greedy generation follows the model's own full forward", "[gpu][rollout]") {
  torch::NoGradGuard no_grad;
  const bool qwen3 = GENERATE(false, true);
  const int64_t blocks = GENERATE(0, 20);
  INFO((qwen3 ? "qwen3-like" : "qwen2-like") << ", cache blocks " << blocks);
  model::Transformer model = SmallModel(qwen3);
  REQUIRE(FusedDecoder::Supports(model));
  EngineOptions options;
  options.max_model_len = 128;
  options.max_num_seqs = 24;
  options.cache_blocks_override = blocks;
  auto engine = GenerationEngine::Create(model, options);
  REQUIRE(engine.ok());
  const auto requests = Prompts(40, 24);  // More prompts than rows: continuous batching.
  auto results = (*engine)->Generate(requests);
  INFO(results.status().ToString());
  REQUIRE(results.ok());
  CHECK_FALSE((*engine)->stats().graph_batch_sizes.empty());
  CHECK(((*engine)->stats().preemptions > 0) == (blocks > 0));
  CheckAgainstFullForward(model, requests, *results,
                          absl::StrCat(qwen3 ? "qwen3-like, " : "qwen2-like, ",
                                       (*engine)->stats().preemptions, " preemptions"));
}

// Prompts sharing a 100-token prefix (three whole blocks of 32), prefilled one at a time: each
// after the first finds those blocks in the prefix cache and prefills its own tokens only,
// attending the cached keys (PagedAttention over the gathered blocks), then follows the model's
// own full forward as the uncached prompts do.
TEST_CASE("prompts sharing a prefix prefill it once and follow the full forward",
          "[gpu][rollout]") {
  torch::NoGradGuard no_grad;
  const bool qwen3 = GENERATE(false, true);
  INFO((qwen3 ? "qwen3-like" : "qwen2-like"));
  model::Transformer model = SmallModel(qwen3);
  EngineOptions options;
  options.max_model_len = 160;
  options.max_num_seqs = 16;
  options.max_prefill_tokens = 130;  // One prompt per prefill.
  auto engine = GenerationEngine::Create(model, options);
  REQUIRE(engine.ok());
  std::vector<GenerationRequest> requests = Prompts(16, 24);
  for (size_t i = 0; i < requests.size(); ++i) {
    std::vector<int64_t> prompt;
    for (int t = 0; t < 100; ++t) prompt.push_back((t * 29 + 7) % 2048);
    for (size_t t = 0; t < 5 + i; ++t) prompt.push_back((i * 131 + t * 17) % 2048);
    requests[i].prompt_ids = prompt;
  }
  auto results = (*engine)->Generate(requests);
  INFO(results.status().ToString());
  REQUIRE(results.ok());
  CHECK((*engine)->stats().cached_prefix_tokens == 15 * 96);
  CheckAgainstFullForward(model, requests, *results,
                          absl::StrCat(qwen3 ? "qwen3-like" : "qwen2-like", ", shared prefix"));
}

TEST_CASE("CUDA-graph decoding equals eager decoding", "[gpu][rollout]") {
  model::Transformer model = SmallModel();
  EngineOptions options;
  options.max_model_len = 128;
  options.max_num_seqs = 16;
  auto graphs = GenerationEngine::Create(model, options);
  options.cuda_graphs = false;
  auto eager = GenerationEngine::Create(model, options);
  REQUIRE(graphs.ok());
  REQUIRE(eager.ok());
  auto requests = Prompts(16, 20);
  for (size_t i = 0; i < requests.size(); i += 2) {
    requests[i].sampling.temperature = 1.0;
    requests[i].sampling.seed = i;
  }
  auto a = (*graphs)->Generate(requests);
  auto b = (*eager)->Generate(requests);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK_FALSE((*graphs)->stats().graph_batch_sizes.empty());
  CHECK((*eager)->stats().graph_batch_sizes.empty());
  for (size_t i = 0; i < requests.size(); ++i) {
    CHECK((*a)[i].samples[0].token_ids == (*b)[i].samples[0].token_ids);
  }
}

TEST_CASE("a GRPO batch prefills each prompt once, with the tokens of unshared prompts",
          "[gpu][rollout]") {
  // 64 prompts x n 8 of P = 1,024 (issue [rollout-tp]): 64 prefills of 1,024 tokens, not 512,
  // the 8 samples holding the prompt's 32 blocks together (each takes one more for its response);
  // greedy tokens equal to 512 separate n = 1 requests of the same prompts (the same prefill and
  // decode batch shapes either way), which hold 512 x 33 blocks.
  torch::NoGradGuard no_grad;
  model::Transformer model = SmallModel();
  EngineOptions options;
  options.max_model_len = 1024 + 16;
  options.max_num_seqs = 512;
  auto engine = GenerationEngine::Create(model, options);
  REQUIRE(engine.ok());
  std::vector<GenerationRequest> grouped, separate;
  for (int i = 0; i < 64; ++i) {
    GenerationRequest request;
    for (int t = 0; t < 1024; ++t) request.prompt_ids.push_back((i * 131 + t * 17 + t * t) % 2048);
    request.sampling.temperature = 0;
    request.sampling.max_new_tokens = 16;
    request.sampling.ignore_eos = true;
    for (int j = 0; j < 8; ++j) separate.push_back(request);
    request.sampling.n = 8;
    grouped.push_back(request);
  }
  auto shared = (*engine)->Generate(grouped);
  REQUIRE(shared.ok());
  CHECK((*engine)->stats().prompts == 64);
  CHECK((*engine)->stats().prefill_tokens == 64 * 1024);
  CHECK((*engine)->stats().peak_blocks == 64 * 32 + 512);
  auto alone = (*engine)->Generate(separate);
  REQUIRE(alone.ok());
  CHECK((*engine)->stats().prompts == 64 + 512);
  for (int i = 0; i < 64; ++i) {
    REQUIRE((*shared)[i].samples.size() == 8);
    for (int j = 0; j < 8; ++j) {
      INFO("prompt " << i << " sample " << j);
      CHECK((*shared)[i].samples[j].token_ids == (*alone)[i * 8 + j].samples[0].token_ids);
    }
  }
}

TEST_CASE("after release the engine holds no GPU memory beyond the weights", "[gpu][rollout]") {
  model::Transformer model = SmallModel();
  {
    torch::NoGradGuard no_grad;  // One forward first: the model's own lazy state (rotary table).
    model->Hidden({at::ones({1, 4}, at::TensorOptions().dtype(at::kLong).device(kGpu))});
  }
  Synchronize(kGpu);
  worker::ReleaseCachedMemory(kGpu);
  const worker::DeviceMemory weights = worker::QueryDeviceMemory(kGpu);
  EngineOptions options;
  options.gpu_memory_utilization = 0.05;
  options.max_model_len = 512;
  auto engine = GenerationEngine::Create(model, options);
  REQUIRE(engine.ok());
  {
    auto results = (*engine)->Generate(Prompts(64, 32));
    INFO(results.status().ToString());
    REQUIRE(results.ok());
  }
  const worker::DeviceMemory during = worker::QueryDeviceMemory(kGpu);
  (*engine)->Release();
  const worker::DeviceMemory released = worker::QueryDeviceMemory(kGpu);
  std::cout << "rollout_gpu: allocated MiB: weights " << (weights.allocated_bytes >> 20)
            << ", engine holding cache+graphs " << (during.allocated_bytes >> 20) << " (peak "
            << ((*engine)->stats().peak_memory_bytes >> 20) << ", cache "
            << ((*engine)->stats().cache_bytes >> 20) << "), after release "
            << (released.allocated_bytes >> 20) << "; reserved after release "
            << (released.reserved_bytes >> 20) << "\n";
  CHECK(during.allocated_bytes > weights.allocated_bytes + (*engine)->stats().cache_bytes / 2);
  CHECK(released.allocated_bytes <= weights.allocated_bytes);
  CHECK(released.reserved_bytes <= weights.reserved_bytes);
  // And it generates again after release.
  auto again = (*engine)->Generate(Prompts(4, 4));
  INFO(again.status().ToString());
  CHECK(again.ok());
}

// A decode-graph capture that fails is ended (the capture stream does not stay in capture mode:
// the next capture on it succeeds) and rethrows what it failed with, its batch size added to the
// message; an out-of-memory error stays one, which the engine reports as out of memory.
TEST_CASE("a failed decode-graph capture is ended and rethrown with its batch", "[gpu][rollout]") {
  DecodeGraphs graphs(kGpu);
  graphs.Plan({8});
  const at::Tensor input = at::ones({8, 4}, kGpu);
  int calls = 0;
  const auto fails_in_capture = [&]() -> at::Tensor {
    const at::Tensor doubled = input * 2;
    // The first call is the warm-up; the second runs inside the capture.
    TORCH_CHECK_WITH(OutOfMemoryError, ++calls < 2, "this test's failure");
    return doubled;
  };
  bool out_of_memory = false;
  std::string message;
  try {
    graphs.Replay(8, fails_in_capture);
  } catch (const c10::OutOfMemoryError& error) {
    out_of_memory = true;
    message = error.what_without_backtrace();
  }
  CHECK(out_of_memory);
  CHECK(message.find("this test's failure") != std::string::npos);
  CHECK(message.find("capturing the decode step for batch 8") != std::string::npos);
  CHECK(graphs.CapturedSizes().empty());
  const at::Tensor tripled = graphs.Replay(8, [&] { return input * 3; });
  CHECK(at::equal(tripled.cpu(), at::full({8, 4}, 3.f)));
  CHECK(graphs.CapturedSizes() == std::vector<int64_t>{8});
}

}  // namespace rlhfd::rollout
