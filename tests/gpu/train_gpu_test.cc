// [gpu] ChunkedLogProbs through its fused kernels against a float64 CPU computation from full
// logits (log_softmax, entropy, autograd): values and gradients, float32 and under bf16 and fp16
// autocast, a vocabulary of vector loads (1024) and one of scalar loads (1001), rows over several
// chunks; the logits kept from the forward against the recomputed ones; and an id outside the
// vocabulary. Packed sequences through FlashAttention's variable-length kernel against each
// sequence alone, and rows sharing a prompt computed once against each row whole, float64 on the
// CPU. An update of several mini-batches under autocast against one update per mini-batch.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/autograd.h>
#include <torch/types.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <string>

#include "worker/model/model_loader.h"
#include "worker/model/transformer.h"
#include "worker/train/batching.h"
#include "worker/train/chunked_log_probs.h"
#include "worker/train/policy_update.h"
#include "worker/train/trained_model.h"

namespace rlhfd::train {
namespace {

struct Results {
  at::Tensor log_prob, entropy, grad_hidden, grad_weight;
};

// Σ a·log_prob + b·entropy, differentiated: both outputs' gradients reach the backward.
Results Run(const at::Tensor& hidden0, const at::Tensor& weight0, const at::Tensor& targets,
            const at::Tensor& a, const at::Tensor& b, bool chunked) {
  at::Tensor hidden = hidden0.clone().set_requires_grad(true);
  at::Tensor weight = weight0.clone().set_requires_grad(true);
  at::Tensor log_prob, entropy;
  if (chunked) {
    std::tie(log_prob, entropy) = ChunkedLogProbs(hidden, weight, targets, /*chunk=*/128);
  } else {
    const at::Tensor logits = at::mm(hidden, weight.t());
    const at::Tensor log_p = at::log_softmax(logits, -1);
    log_prob = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
    entropy = -(log_p.exp() * log_p).sum(-1);
  }
  ((a * log_prob).sum() + (b * entropy).sum()).backward();
  return {log_prob.detach(), entropy.detach(), hidden.grad(), weight.grad()};
}

// The committed model fixtures: RLHFD_FIXTURES_DIR (a bundle on another machine), else this
// checkout's.
std::string FixturesDir() {
  const char* env = std::getenv("RLHFD_FIXTURES_DIR");
  return env != nullptr ? env : RLHFD_FIXTURES_DIR;
}

double Relative(const at::Tensor& ours, const at::Tensor& reference) {
  const at::Tensor r = reference.to(at::kDouble).cpu();
  return ((ours.to(at::kDouble).cpu() - r).norm() / r.norm()).item<double>();
}

}  // namespace

TEST_CASE("fused log-probs on the GPU equal float64 full logits, values and gradients",
          "[gpu][train][log_probs]") {
  const at::Device device(at::kCUDA, 0);
  at::manual_seed(5);
  for (const int64_t vocab : {1024, 1001}) {
    // kFloat: no autocast; otherwise the autocast dtype, which the gradient is written in.
    for (const at::ScalarType compute : {at::kFloat, at::kBFloat16, at::kHalf}) {
      const bool autocast = compute != at::kFloat;
      const std::string name = autocast ? std::string(c10::toString(compute)) : "fp32";
      INFO("vocab " << vocab << ", " << name);
      const int64_t rows = 300, width = 64;
      const at::Tensor hidden = at::randn({rows, width}) * 0.5;
      const at::Tensor weight = at::randn({vocab, width}) * 0.5;
      const at::Tensor targets = at::randint(0, vocab, {rows}, at::kLong);
      const at::Tensor a = at::randn({rows}), b = at::randn({rows});
      // Under autocast the GEMMs take inputs in its dtype: the reference starts from that rounding.
      const auto rounded = [&](const at::Tensor& t) { return t.to(compute).to(at::kDouble); };
      const Results reference = Run(rounded(hidden), rounded(weight), targets, a.to(at::kDouble),
                                    b.to(at::kDouble), /*chunked=*/false);
      at::autocast::set_autocast_enabled(at::kCUDA, autocast);
      at::autocast::set_autocast_dtype(at::kCUDA, autocast ? compute : at::kBFloat16);
      const Results ours = Run(hidden.to(device), weight.to(device), targets.to(device),
                               a.to(device), b.to(device), /*chunked=*/true);
      at::autocast::set_autocast_enabled(at::kCUDA, false);
      at::autocast::clear_cache();
      REQUIRE(ours.log_prob.is_cuda());
      REQUIRE(ours.log_prob.scalar_type() == at::kFloat);
      const double lp =
          (ours.log_prob.cpu().to(at::kDouble) - reference.log_prob).abs().max().item<double>();
      const double h =
          (ours.entropy.cpu().to(at::kDouble) - reference.entropy).abs().max().item<double>();
      const double gh = Relative(ours.grad_hidden, reference.grad_hidden);
      const double gw = Relative(ours.grad_weight, reference.grad_weight);
      std::cout << "train_gpu: vocab " << vocab << " " << name << ": max |log-prob error| " << lp
                << ", max |entropy error| " << h << ", gradient relative errors " << gh
                << " (hidden), " << gw << " (weight)\n";
      // Values: float32 accumulation of exact (or equally rounded) products.
      CHECK(lp <= 1e-4);
      CHECK(h <= 1e-4);
      // Gradients: exact to float32 without autocast; with it the logits' gradient is rounded
      // to the GEMMs' dtype: bf16 keeps 8 significant bits, fp16 11.
      const double bound = compute == at::kFloat ? 1e-5 : compute == at::kHalf ? 2e-3 : 1e-2;
      CHECK(gh <= bound);
      CHECK(gw <= bound);
    }
  }
}

TEST_CASE("logits kept from the forward give the recomputed logits' gradients bit for bit",
          "[gpu][train][log_probs]") {
  // The first backward through a retained graph uses the logits the forward kept (the device has
  // room: the allocation after the forward holds them) and frees them; the second finds none and
  // recomputes.
  const at::Device device(at::kCUDA, 0);
  at::manual_seed(7);
  const int64_t rows = 300, width = 64, vocab = 1024;
  const at::Tensor hidden = (at::randn({rows, width}, device) * 0.5).set_requires_grad(true);
  const at::Tensor weight = (at::randn({vocab, width}, device) * 0.5).set_requires_grad(true);
  const at::Tensor targets =
      at::randint(0, vocab, {rows}, at::TensorOptions(device).dtype(at::kLong));
  const at::Tensor a = at::randn({rows}, device), b = at::randn({rows}, device);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  const auto allocated = [] {
    constexpr auto kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[kAll].current;
  };
  const int64_t before = allocated();
  const auto [log_prob, entropy] = ChunkedLogProbs(hidden, weight, targets, /*chunk=*/128);
  const int64_t held = allocated() - before;
  const at::Tensor loss = (a * log_prob).sum() + (b * entropy).sum();
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::clear_cache();
  // Three chunks' float32 logits besides the per-row results.
  CHECK(held >= rows * vocab * 4);
  const auto kept = torch::autograd::grad({loss}, {hidden, weight}, {}, /*retain_graph=*/true);
  // The backward freed them (the gradients and the per-row results are far smaller).
  CHECK(allocated() - before < rows * vocab * 4);
  const auto recomputed = torch::autograd::grad({loss}, {hidden, weight});
  CHECK(at::equal(kept[0], recomputed[0]));
  CHECK(at::equal(kept[1], recomputed[1]));
  CHECK(kept[0].abs().sum().item<double>() > 0);
}

TEST_CASE("an id outside the vocabulary gets a NaN log-prob on the GPU, never another row's",
          "[gpu][train][log_probs]") {
  const at::Device device(at::kCUDA, 0);
  at::manual_seed(6);
  const int64_t rows = 200, width = 32, vocab = 1000;
  const at::Tensor hidden = at::randn({rows, width}, device);
  const at::Tensor weight = at::randn({vocab, width}, device);
  at::Tensor targets = at::randint(0, vocab, {rows}, at::TensorOptions(device).dtype(at::kLong));
  targets[3] = vocab;  // one past the end
  targets[150] = -1;
  const auto [log_prob, entropy] = ChunkedLogProbs(hidden, weight, targets, /*chunk=*/64);
  const at::Tensor bad = at::isnan(log_prob).cpu();
  CHECK(bad[3].item<bool>());
  CHECK(bad[150].item<bool>());
  CHECK(bad.sum().item<int64_t>() == 2);
  CHECK(at::isfinite(entropy).all().item<bool>());
}

TEST_CASE("packed sequences through the variable-length kernel equal each sequence alone",
          "[gpu][train][packing]") {
  // The bf16 packed forward (the training path: one row, cu_seqlens, no mask) and each sequence's
  // own bf16 causal forward (SDPA, nothing packed) both against float64 on the CPU: the packed
  // path may be no further from it than twice the unpacked one (plus 5e-3), hidden states and
  // every parameter's gradient, with and without activation checkpointing.
  const at::Device device(at::kCUDA, 0);
  const std::string dir = FixturesDir() + "/models/tiny-qwen2";
  auto reference = model::LoadModel(dir, {at::kDouble, at::kCPU});
  REQUIRE(reference.ok());
  const int64_t head_dim = (*reference)->config().head_dim;
  REQUIRE(model::VarlenAttentionApplies(device, at::kBFloat16, head_dim));
  at::manual_seed(12);
  const std::vector<int64_t> lengths = {37, 5, 120, 64, 1, 90};
  std::vector<at::Tensor> sequences;
  std::vector<int64_t> starts = {0};
  for (int64_t n : lengths) {
    sequences.push_back(at::randint(3, 500, {n}, at::kLong));
    starts.push_back(starts.back() + n);
  }
  const int64_t total = starts.back(), width = (*reference)->config().hidden_size;
  const at::Tensor weights = at::randn({total, width}, at::kDouble);

  // Hidden states (total, C) and each parameter's gradient of Σ weights · hidden.
  struct Pass {
    at::Tensor hidden;
    std::vector<at::Tensor> grads;
  };
  const auto finish = [&](model::Transformer& net, const at::Tensor& hidden) {
    (hidden.to(at::kDouble) * weights.to(hidden.device())).sum().backward();
    Pass pass{hidden.detach().to(at::kDouble).cpu(), {}};
    for (const at::Tensor& p : net->parameters())
      pass.grads.push_back(p.grad().to(at::kDouble).cpu());
    return pass;
  };
  const auto each_alone = [&](model::Transformer& net, const at::Device& on) {
    std::vector<at::Tensor> hidden;
    for (const at::Tensor& sequence : sequences) {
      hidden.push_back(net->Hidden({sequence.to(on).unsqueeze(0)}).squeeze(0));
    }
    return finish(net, at::cat(hidden));
  };
  const Pass exact = each_alone(*reference, at::kCPU);

  for (bool checkpointing : {false, true}) {
    INFO("activation checkpointing " << checkpointing);
    const auto bf16_pass = [&](bool packed) {
      auto loaded = model::LoadModel(dir, {at::kFloat, device});
      REQUIRE(loaded.ok());
      model::Transformer net = *loaded;
      net->set_activation_checkpointing(checkpointing);
      at::autocast::set_autocast_enabled(at::kCUDA, true);
      at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
      Pass pass;
      if (packed) {
        // The variable-length kernel, not the masked fallback, is what this pass runs.
        REQUIRE(net->PacksWithVarlenAttention(device));
        model::ForwardBatch batch{at::cat(sequences).to(device).unsqueeze(0)};
        batch.cu_seqlens = at::tensor(starts, at::kLong).to(device);
        pass = finish(net, net->Hidden(batch).squeeze(0));
      } else {
        pass = each_alone(net, device);
      }
      at::autocast::set_autocast_enabled(at::kCUDA, false);
      return pass;
    };
    const Pass packed = bf16_pass(true), alone = bf16_pass(false);
    const double packed_error = Relative(packed.hidden, exact.hidden);
    const double alone_error = Relative(alone.hidden, exact.hidden);
    INFO("hidden: packed " << packed_error << ", alone " << alone_error);
    CHECK(packed_error <= 2 * alone_error + 5e-3);
    for (size_t i = 0; i < exact.grads.size(); ++i) {
      const double packed_grad = Relative(packed.grads[i], exact.grads[i]);
      const double alone_grad = Relative(alone.grads[i], exact.grads[i]);
      INFO("parameter " << i << ": packed " << packed_grad << ", alone " << alone_grad);
      CHECK(packed_grad <= 2 * alone_grad + 5e-3);
    }
  }
}

TEST_CASE("rows sharing a prompt through the variable-length kernel equal each row computed whole",
          "[gpu][train][packing]") {
  // A GRPO-shaped micro-batch (4 prompts of 60 to 150 tokens, left-padded, × 4 samples of 1 to 70
  // response tokens, right-padded; two samples beginning their responses alike) through
  // ForwardMicroBatch as the update runs it on a GPU: packed, each prompt computed once, only the
  // response positions scored. Its log-probs and every parameter's gradient of a weighted sum of
  // them, and those of the same rows packed without sharing, against float64 on the CPU (padded,
  // each row whole): shared no further from it than twice unshared (plus 5e-3).
  const at::Device device(at::kCUDA, 0);
  const std::string dir = FixturesDir() + "/models/tiny-qwen2";
  at::manual_seed(21);
  const int64_t groups = 4, samples = 4, prompt_width = 150, response_width = 70;
  const int64_t rows = groups * samples, t = prompt_width + response_width;
  const std::vector<int64_t> prompt_lengths = {150, 60, 97, 128};
  at::Tensor ids = at::zeros({rows, t}, at::kLong), attention = at::zeros({rows, t}, at::kLong);
  at::Tensor response = at::zeros({rows, t - 1}, at::kDouble);
  for (int64_t g = 0; g < groups; ++g) {
    const at::Tensor prompt = at::randint(3, 500, {prompt_lengths[g]}, at::kLong);
    const int64_t first = prompt_width - prompt_lengths[g];
    for (int64_t k = 0; k < samples; ++k) {
      const int64_t row = g * samples + k, length = 1 + (row * 37) % response_width;
      ids[row].narrow(0, first, prompt_lengths[g]).copy_(prompt);
      ids[row].narrow(0, prompt_width, length).copy_(at::randint(3, 500, {length}));
      attention[row].narrow(0, first, prompt_lengths[g] + length).fill_(1);
      response[row].narrow(0, prompt_width - 1, length).fill_(1);
    }
  }
  // Rows 6 and 7 (13 and 50 response tokens) begin their responses alike.
  ids[7].narrow(0, prompt_width, 10).copy_(ids[6].narrow(0, prompt_width, 10));
  const at::Tensor weights =
      at::linspace(0.5, 1.5, rows * (t - 1), at::kDouble).view({rows, t - 1});
  {
    // The plan computes 4 prompts, not 16.
    const at::Tensor real = attention.ne(0).contiguous();
    const PackedRows plan = PlanPackedRows(ids.data_ptr<int64_t>(), real.data_ptr<bool>(), nullptr,
                                           rows, t, /*share=*/true);
    const int64_t responses =
        attention.sum().item<int64_t>() -
        samples * std::accumulate(prompt_lengths.begin(), prompt_lengths.end(), int64_t{0});
    CHECK(static_cast<int64_t>(plan.tokens.size()) ==
          responses + std::accumulate(prompt_lengths.begin(), prompt_lengths.end(), int64_t{0}) -
              10);
  }
  struct Pass {
    at::Tensor log_probs;
    std::vector<at::Tensor> grads;
  };
  const auto pass = [&](model::Transformer& net, const at::Device& on,
                        const MicroBatchForward& how) {
    const ScoredPositions positions = ForwardMicroBatch(net, ids.to(on), attention.to(on), how);
    const at::Tensor log_probs =
        positions
            .Unflatten(
                ChunkedLogProbs(positions.hidden, net->HeadWeight(), positions.targets).first)
            .to(at::kDouble)
            .cpu() *
        response;
    (log_probs * weights).sum().backward();
    Pass result{log_probs.detach(), {}};
    for (const at::Tensor& p : net->parameters()) {
      result.grads.push_back(p.grad().to(at::kDouble).cpu());
    }
    return result;
  };
  auto reference = model::LoadModel(dir, {at::kDouble, at::kCPU});
  REQUIRE(reference.ok());
  const Pass exact = pass(*reference, at::kCPU, {.share_prefixes = false});
  for (bool checkpointing : {false, true}) {
    INFO("activation checkpointing " << checkpointing);
    const auto bf16_pass = [&](bool share) {
      auto loaded = model::LoadModel(dir, {at::kFloat, device});
      REQUIRE(loaded.ok());
      model::Transformer net = *loaded;
      net->set_activation_checkpointing(checkpointing);
      at::autocast::set_autocast_enabled(at::kCUDA, true);
      at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
      REQUIRE(net->PacksWithVarlenAttention(device));
      const Pass result = share ? pass(net, device, {.scored = response})
                                : pass(net, device, {.share_prefixes = false});
      at::autocast::set_autocast_enabled(at::kCUDA, false);
      return result;
    };
    const Pass shared = bf16_pass(true), unshared = bf16_pass(false);
    const double shared_error = Relative(shared.log_probs, exact.log_probs);
    const double unshared_error = Relative(unshared.log_probs, exact.log_probs);
    INFO("log-probs: shared " << shared_error << ", unshared " << unshared_error);
    CHECK(shared_error <= 2 * unshared_error + 5e-3);
    for (size_t i = 0; i < exact.grads.size(); ++i) {
      const double shared_grad = Relative(shared.grads[i], exact.grads[i]);
      const double unshared_grad = Relative(unshared.grads[i], exact.grads[i]);
      INFO("parameter " << i << ": shared " << shared_grad << ", unshared " << unshared_grad);
      CHECK(shared_grad <= 2 * unshared_grad + 5e-3);
    }
  }
}

TEST_CASE("an update's later mini-batches compute with the weights of the steps before them",
          "[gpu][train][update]") {
  // Four optimiser steps under bf16 autocast with float32 masters, as the roles run the actor's
  // update on a GPU: once as one update of four mini-batches (with and without activation
  // checkpointing), once as four updates of one mini-batch each, autocast's casts dropped between
  // them (the reference: no cast can outlive a step there). Every row is the same sequence, so
  // any shuffle gives both the same mini-batches. Autocast keeps a float32 parameter's cast by
  // tensor, not by value, for the process. Before the fix the one update computed its later
  // mini-batches with the weights it started from. They may differ by the backward's own
  // non-determinism: the weights' movement agrees within 1e-2 (relative, whole model).
  const at::Device device(at::kCUDA, 0);
  const std::string dir = FixturesDir() + "/models/tiny-qwen2";
  at::manual_seed(31);
  const int64_t b = 8, t = 48, steps = 4;
  PolicyUpdateBatch batch;
  batch.input_ids = at::randint(3, 500, {1, t}, at::kLong).expand({b, t}).contiguous().to(device);
  batch.attention_mask = at::ones({b, t}, at::kLong).to(device);
  batch.response_mask = at::zeros({b, t - 1}, device);
  batch.response_mask.narrow(1, 16, t - 17).fill_(1);
  batch.advantages =
      (at::randn({1, t - 1}).expand({b, t - 1}).to(device) * batch.response_mask).contiguous();
  auto start = model::LoadModel(dir, {at::kFloat, device});
  REQUIRE(start.ok());
  {
    torch::NoGradGuard no_grad;
    batch.old_log_probs = at::log_softmax((*start)->Logits((*start)->Hidden({batch.input_ids})), -1)
                              .narrow(1, 0, t - 1)
                              .gather(-1, batch.input_ids.narrow(1, 1, t - 1).unsqueeze(-1))
                              .squeeze(-1);
  }
  const auto rows = [&](const at::Tensor& tensor, int64_t n) { return tensor.narrow(0, 0, n); };
  const auto update = [&](bool one_call, bool checkpointing) {
    auto loaded = model::LoadModel(dir, {at::kFloat, device});
    REQUIRE(loaded.ok());
    model::Transformer net = *loaded;
    LocalModel trained(net, {});
    PolicyUpdateOptions options;
    options.loop.mini_batch = b / steps;
    options.loop.lr = 1e-2;
    options.loop.micro = {.micro_batch = b / steps, .activation_checkpointing = checkpointing};
    PolicyUpdateBatch one_step = batch;
    for (at::Tensor* tensor :
         {&one_step.input_ids, &one_step.attention_mask, &one_step.response_mask,
          &one_step.advantages, &one_step.old_log_probs}) {
      *tensor = rows(*tensor, b / steps);
    }
    for (int64_t call = 0; call < (one_call ? 1 : steps); ++call) {
      at::autocast::set_autocast_enabled(at::kCUDA, true);
      at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
      auto metrics = UpdatePolicy(trained, one_call ? batch : one_step, options);
      at::autocast::set_autocast_enabled(at::kCUDA, false);
      at::autocast::clear_cache();
      REQUIRE(metrics.ok());
      CHECK(metrics->at("optimizer_steps") == (one_call ? steps : 1));
    }
    std::vector<at::Tensor> moved;
    for (size_t i = 0; i < net->parameters().size(); ++i) {
      moved.push_back((net->parameters()[i] - (*start)->parameters()[i]).detach().flatten());
    }
    return at::cat(moved).to(at::kDouble);
  };
  const at::Tensor reference = update(/*one_call=*/false, /*checkpointing=*/false);
  CHECK(reference.norm().item<double>() > 1e-2);
  for (const bool checkpointing : {false, true}) {
    INFO("activation checkpointing " << checkpointing);
    const at::Tensor ours = update(/*one_call=*/true, checkpointing);
    const double relative = ((ours - reference).norm() / reference.norm()).item<double>();
    std::cout << "train_gpu: one update of four mini-batches (checkpointing " << checkpointing
              << ") against four updates, relative difference of the weights' movement " << relative
              << " (movement norm " << reference.norm().item<double>() << ")\n";
    CHECK(relative <= 1e-2);
  }
}

}  // namespace rlhfd::train
