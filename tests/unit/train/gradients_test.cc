// The policy-loss path through a tiny transformer (finite-difference gradients in float64, and
// the direction of one update), and the computations that must give the full computation's
// values and gradients: chunked log-probs and entropy, activation checkpointing, packed sequences.
#include <ATen/ATen.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "tests/unit/train/train_test_support.h"
#include "worker/model/model_loader.h"
#include "worker/train/chunked_log_probs.h"
#include "worker/train/log_probs.h"
#include "worker/train/losses.h"

namespace rlhfd::train {
namespace {

using testing::ToTensor;

TEST_CASE("the policy-loss path through a tiny transformer", "[train][gradient]") {
  auto loaded = model::LoadModel(std::string(RLHFD_FIXTURES_DIR) + "/models/tiny-qwen2",
                                 {at::kDouble, at::kCPU});
  REQUIRE(loaded.ok());
  model::Transformer net = *loaded;
  at::manual_seed(3);
  const at::Tensor ids = at::randint(3, 500, {2, 6}, at::kLong);
  const at::Tensor mask = at::ones({2, 5}, at::kDouble);
  const at::Tensor targets = ids.narrow(1, 1, 5);
  auto token_log_probs = [&] {
    at::Tensor logits = net->Logits(net->Hidden({ids})).narrow(1, 0, 5);  // (2, 5, V)
    return TokenLogProbs(logits, targets);                                // (2, 5)
  };
  at::Tensor old;
  {
    torch::NoGradGuard no_grad;
    old = token_log_probs() - 0.05;  // A slightly different behaviour policy.
  }
  const at::Tensor advantages =
      ToTensor({{1.0, -0.5, 0.3, -1.0, 0.8}, {-0.2, 0.6, -1.2, 0.4, 1.0}});
  PolicyLossOptions options{.clip_ratio_low = 0.2, .clip_ratio_high = 0.28, .clip_ratio_c = 3.0};
  auto loss_value = [&] {
    return ComputePolicyLoss(token_log_probs(), old, advantages, mask, options).loss;
  };

  SECTION("finite-difference gradients match autograd in float64") {
    at::Tensor loss = loss_value();
    loss.backward();
    auto params = net->named_parameters();
    for (const std::string name :
         {"model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight",
          "model.norm.weight", "model.embed_tokens.weight"}) {
      at::Tensor p = params[name];
      at::Tensor grad = p.grad().clone();
      const double eps = 1e-6;
      for (int64_t k : {0, 7, 31}) {
        torch::NoGradGuard no_grad;
        at::Tensor flat = p.view({-1});
        const int64_t index = (k * 997) % flat.numel();
        const double saved = flat[index].item<double>();
        flat[index] = saved + eps;
        const double plus = loss_value().item<double>();
        flat[index] = saved - eps;
        const double minus = loss_value().item<double>();
        flat[index] = saved;
        const double numeric = (plus - minus) / (2 * eps);
        const double analytic = grad.view({-1})[index].item<double>();
        INFO(name << "[" << index << "] numeric " << numeric << " autograd " << analytic);
        CHECK(std::abs(numeric - analytic) <= 1e-6 + 1e-5 * std::abs(analytic));
      }
    }
  }

  SECTION("one update raises log-probs where A > 0, lowers them where A < 0, and flips with A") {
    for (const double sign : {1.0, -1.0}) {
      auto fresh = model::LoadModel(std::string(RLHFD_FIXTURES_DIR) + "/models/tiny-qwen2",
                                    {at::kDouble, at::kCPU});
      REQUIRE(fresh.ok());
      net = *fresh;
      at::Tensor before;
      {
        torch::NoGradGuard no_grad;
        before = token_log_probs();
      }
      const at::Tensor signed_advantages =
          sign * ToTensor({{1.0, -1.0, 1.0, -1.0, 1.0}, {-1.0, 1.0, -1.0, 1.0, -1.0}});
      ComputePolicyLoss(token_log_probs(), before, signed_advantages, mask, options)
          .loss.backward();
      {
        torch::NoGradGuard no_grad;
        for (auto& p : net->parameters()) p.sub_(1e-3 * p.grad());
      }
      at::Tensor delta;
      {
        torch::NoGradGuard no_grad;
        delta = token_log_probs() - before;
      }
      // Summed over the tokens of each sign, the update moves log-probs the advantage's way.
      const double up = (delta * signed_advantages.gt(0)).sum().item<double>();
      const double down = (delta * signed_advantages.lt(0)).sum().item<double>();
      INFO("sign " << sign << ": positive-A tokens " << up << ", negative-A tokens " << down);
      CHECK(up > 0);
      CHECK(down < 0);
    }
  }
}

TEST_CASE("chunked log-probs and entropy equal the full-logits computation, values and gradients",
          "[train][log_probs]") {
  at::manual_seed(13);
  for (const at::ScalarType dtype : {at::kDouble, at::kFloat}) {
    const double tolerance = dtype == at::kDouble ? 1e-10 : 2e-5;
    const at::Tensor hidden0 = at::randn({37, 8}, dtype);
    const at::Tensor weight0 = at::randn({50, 8}, dtype);
    const at::Tensor targets = at::randint(0, 50, {37}, at::kLong);
    const at::Tensor a = at::randn({37}, dtype), b = at::randn({37}, dtype);

    at::Tensor hidden = hidden0.clone().set_requires_grad(true);
    at::Tensor weight = weight0.clone().set_requires_grad(true);
    at::Tensor logits = at::mm(hidden, weight.t()).unsqueeze(0);  // (1, N, V)
    at::Tensor lp = TokenLogProbs(logits, targets.unsqueeze(0)).squeeze(0);
    at::Tensor entropy = TokenEntropy(logits).squeeze(0);
    ((a * lp).sum() + (b * entropy).sum()).backward();

    for (const int64_t chunk : {5, 64}) {
      INFO("dtype " << dtype << ", chunk " << chunk);
      at::Tensor h = hidden0.clone().set_requires_grad(true);
      at::Tensor w = weight0.clone().set_requires_grad(true);
      auto [chunked_lp, chunked_entropy] = ChunkedLogProbs(h, w, targets, chunk);
      ((a * chunked_lp).sum() + (b * chunked_entropy).sum()).backward();
      CHECK((chunked_lp - lp).abs().max().item<double>() <= tolerance);
      CHECK((chunked_entropy - entropy).abs().max().item<double>() <= tolerance);
      CHECK((h.grad() - hidden.grad()).abs().max().item<double>() <= tolerance);
      CHECK((w.grad() - weight.grad()).abs().max().item<double>() <= tolerance);
    }
  }
}

TEST_CASE("activation checkpointing gives the same gradients (float64)", "[train][checkpoint]") {
  auto loaded = model::LoadModel(std::string(RLHFD_FIXTURES_DIR) + "/models/tiny-qwen3",
                                 {at::kDouble, at::kCPU});
  REQUIRE(loaded.ok());
  model::Transformer net = *loaded;
  at::manual_seed(5);
  const at::Tensor ids = at::randint(3, 500, {2, 9}, at::kLong);
  const at::Tensor mask = at::ones({2, 9}, at::kLong).index_put_({1, at::indexing::Slice(6)}, 0);
  const at::Tensor weights = at::randn({2, 9, net->config().vocab_size}, at::kDouble);
  const auto gradients = [&](bool checkpointing) {
    net->set_activation_checkpointing(checkpointing);
    net->zero_grad();
    (net->Logits(net->Hidden({ids, mask})) * weights).sum().backward();
    std::vector<at::Tensor> grads;
    for (const auto& p : net->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const auto plain = gradients(false);
  const auto recomputed = gradients(true);
  double worst = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    worst = std::max(worst, (plain[i] - recomputed[i]).abs().max().item<double>());
  }
  INFO("largest gradient difference " << worst);
  CHECK(worst <= 1e-12);
}

TEST_CASE("packed sequences give the same loss and gradients as the padded batch",
          "[train][packing]") {
  // float64, so the tolerance (1e-10) states that the two layouts compute the same function.
  auto loaded = model::LoadModel(std::string(RLHFD_FIXTURES_DIR) + "/models/tiny-qwen2",
                                 {at::kDouble, at::kCPU});
  REQUIRE(loaded.ok());
  model::Transformer net = *loaded;
  at::manual_seed(11);
  const std::vector<int64_t> lengths = {7, 3, 5};
  std::vector<at::Tensor> sequences;
  for (int64_t n : lengths) sequences.push_back(at::randint(3, 500, {n}, at::kLong));
  const at::Tensor advantages_per_seq = ToTensor({{0.7}, {-1.1}, {0.4}});
  PolicyLossOptions options{.clip_ratio_low = 0.2, .clip_ratio_high = 0.28, .clip_ratio_c = 3.0};

  auto gradients = [&](const at::Tensor& loss) {
    net->zero_grad();
    loss.backward();
    std::vector<at::Tensor> grads;
    for (const auto& p : net->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };

  // Padded: (3, 7) right-padded; scored tokens are positions 1..n-1 of each sequence.
  const int64_t t = 7;
  at::Tensor ids = at::zeros({3, t}, at::kLong), attention = at::zeros({3, t}, at::kLong);
  at::Tensor mask = at::zeros({3, t - 1}, at::kDouble);
  for (int64_t b = 0; b < 3; ++b) {
    ids[b].narrow(0, 0, lengths[b]).copy_(sequences[b]);
    attention[b].narrow(0, 0, lengths[b]).fill_(1);
    mask[b].narrow(0, 0, lengths[b] - 1).fill_(1);
  }
  at::Tensor logits = net->Logits(net->Hidden({ids, attention})).narrow(1, 0, t - 1);
  at::Tensor log_prob = TokenLogProbs(logits, ids.narrow(1, 1, t - 1));
  at::Tensor old = log_prob.detach() - 0.1;
  at::Tensor padded_loss =
      ComputePolicyLoss(log_prob, old, advantages_per_seq.expand({3, t - 1}), mask, options).loss;
  std::vector<at::Tensor> padded_grads = gradients(padded_loss);

  // Packed: one row of 15 tokens; each sequence's scored tokens gathered from its span.
  std::vector<int64_t> starts = {0};
  for (int64_t n : lengths) starts.push_back(starts.back() + n);
  model::ForwardBatch packed{at::cat(sequences).unsqueeze(0)};
  packed.cu_seqlens = at::tensor(starts, at::kLong);
  at::Tensor packed_logits = net->Logits(net->Hidden(packed)).squeeze(0);  // (15, V)
  std::vector<at::Tensor> lp, old_lp, adv;
  for (int64_t b = 0; b < 3; ++b) {
    const int64_t n = lengths[b];
    at::Tensor seq_lp = TokenLogProbs(packed_logits.narrow(0, starts[b], n - 1).unsqueeze(0),
                                      sequences[b].narrow(0, 1, n - 1).unsqueeze(0));
    lp.push_back(seq_lp.squeeze(0));
    old_lp.push_back(old[b].narrow(0, 0, n - 1));
    adv.push_back(advantages_per_seq[b].expand({n - 1}));
  }
  at::Tensor flat_mask = at::ones({1, starts.back() - 3}, at::kDouble);
  at::Tensor packed_loss = ComputePolicyLoss(at::cat(lp).unsqueeze(0), at::cat(old_lp).unsqueeze(0),
                                             at::cat(adv).unsqueeze(0), flat_mask, options)
                               .loss;
  CHECK(std::abs(packed_loss.item<double>() - padded_loss.item<double>()) <= 1e-10);
  std::vector<at::Tensor> packed_grads = gradients(packed_loss);
  REQUIRE(packed_grads.size() == padded_grads.size());
  double worst = 0;
  for (size_t i = 0; i < packed_grads.size(); ++i) {
    worst = std::max(worst, (packed_grads[i] - padded_grads[i]).abs().max().item<double>());
  }
  INFO("largest gradient difference " << worst);
  CHECK(worst <= 1e-10);
}

}  // namespace
}  // namespace rlhfd::train
