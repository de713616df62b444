// The actor's update loop (UpdatePolicy): the same update in float64 whatever the accumulation,
// token budgets, packing or checkpointing (one process, micro-batches against the whole
// mini-batch); the on-policy update that takes its own log-probs; the supervised update's loss
// and gradient; malformed batches refused
// naming the tensor; micro-batches by a token budget.
#include "worker/train/policy_update.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "tests/unit/train/train_test_support.h"
#include "worker/train/batching.h"
#include "worker/train/critic_update.h"
#include "worker/train/log_probs.h"

namespace rlhfd::train {
namespace {

using testing::LoadFloat64Fixture;

// The update takes its log-probs at the rollout's temperature: given old log-probs computed
// independently as log_softmax(logits / T), an on-policy ratio is 1 (nothing clipped, no KL
// between them); at any other temperature it is not.
TEST_CASE("policy update: log-probs at the sampling temperature", "[train][update]") {
  auto load = [] { return LoadFloat64Fixture("tiny-qwen2"); };
  at::manual_seed(5);
  const int64_t b = 2, t = 8;
  PolicyUpdateBatch batch;
  batch.input_ids = at::randint(3, 500, {b, t}, at::kLong);
  batch.attention_mask = at::ones({b, t}, at::kLong);
  batch.response_mask = at::zeros({b, t - 1}, at::kDouble);
  batch.response_mask.narrow(1, 3, t - 4).fill_(1);
  batch.advantages = at::randn({b, t - 1}, at::kDouble) * batch.response_mask;
  const double temperature = 0.6;
  {
    model::Transformer reference = load();
    torch::NoGradGuard no_grad;
    const at::Tensor logits =
        reference->Logits(reference->Hidden({batch.input_ids, batch.attention_mask}))
            .narrow(1, 0, t - 1);
    batch.old_log_probs = at::log_softmax(logits / temperature, -1)
                              .gather(-1, batch.input_ids.narrow(1, 1, t - 1).unsqueeze(-1))
                              .squeeze(-1);
  }
  const auto approx_kl = [&](double at_temperature) {
    model::Transformer net = load();
    LocalModel trained(net, {});
    PolicyUpdateOptions options;
    options.loop.mini_batch = b;
    options.loop.lr = 0;
    options.temperature = at_temperature;
    auto metrics = UpdatePolicy(trained, batch, options);
    REQUIRE(metrics.ok());
    return metrics->at("approx_kl");
  };
  CHECK(std::abs(approx_kl(temperature)) < 1e-10);
  CHECK(std::abs(approx_kl(1.0)) > 1e-3);
}

TEST_CASE("policy update: accumulation, token budgets, packing and checkpointing change nothing",
          "[train][update]") {
  auto load = [] { return LoadFloat64Fixture("tiny-qwen2"); };
  at::manual_seed(21);
  const int64_t b = 4, t = 8;
  const std::vector<int64_t> lengths = {8, 6, 8, 5};  // Right-padded rows of different lengths.
  PolicyUpdateBatch batch;
  batch.input_ids = at::randint(3, 500, {b, t}, at::kLong);
  batch.attention_mask = at::zeros({b, t}, at::kLong);
  batch.response_mask = at::zeros({b, t - 1}, at::kDouble);
  for (int64_t i = 0; i < b; ++i) {
    batch.attention_mask[i].narrow(0, 0, lengths[i]).fill_(1);
    batch.response_mask[i].narrow(0, 3, lengths[i] - 4).fill_(1);  // Response after 4 tokens.
  }
  batch.advantages = at::randn({b, t - 1}, at::kDouble) * batch.response_mask;
  {
    model::Transformer reference = load();
    torch::NoGradGuard no_grad;
    at::Tensor logits =
        reference->Logits(reference->Hidden({batch.input_ids, batch.attention_mask}))
            .narrow(1, 0, t - 1);
    batch.old_log_probs = TokenLogProbs(logits, batch.input_ids.narrow(1, 1, t - 1)) - 0.02;
  }
  batch.ref_log_probs = batch.old_log_probs + 0.01;

  PolicyUpdateOptions options;
  options.loop.mini_batch = 4;
  options.entropy_coeff = 0.01;
  options.kl_coef = 0.1;
  options.loop.lr = 1e-3;
  auto run = [&](MicroBatching micro) {
    model::Transformer net = load();
    LocalModel trained(net, {});
    PolicyUpdateOptions o = options;
    o.loop.micro = micro;
    auto metrics = UpdatePolicy(trained, batch, o);
    REQUIRE(metrics.ok());
    return std::make_pair(net, *metrics);
  };
  auto [whole, whole_metrics] = run({.micro_batch = 4});
  const auto largest_difference = [&](model::Transformer& other) {
    double worst = 0;
    auto a = whole->parameters(), c = other->parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, (a[i] - c[i]).abs().max().item<double>());
    }
    return worst;
  };
  // float64: 1e-10 states that each variant computes the same update.
  const std::vector<std::pair<const char*, MicroBatching>> variants = {
      {"one row per micro-batch", {.micro_batch = 1}},
      {"token budget of 14", {.micro_batch_tokens = 14}},
      {"packed, two rows", {.micro_batch = 2, .packed = true}},
      {"packed with a token budget", {.micro_batch_tokens = 16, .packed = true}},
      {"activation checkpointing", {.micro_batch = 2, .activation_checkpointing = true}},
  };
  for (const auto& [name, micro] : variants) {
    INFO(name);
    auto [net, metrics] = run(micro);
    CHECK(largest_difference(net) <= 1e-10);
    CHECK(metrics.at("grad_norm") == Approx(whole_metrics.at("grad_norm")).epsilon(1e-9));
    CHECK_FALSE(net->activation_checkpointing());  // Restored after the update.
  }
  CHECK(whole_metrics.at("optimizer_steps") == 1);
  for (const char* name : {"policy_loss", "clip_fraction", "clip_fraction_low", "approx_kl",
                           "entropy", "kl_loss", "grad_norm", "lr", "response_tokens_per_s"}) {
    CHECK(whole_metrics.count(name) == 1);
  }
  CHECK(whole_metrics.at("entropy") > 0);

  options.loop.mini_batch = 2;
  options.loop.epochs = 2;
  auto [epochs, epoch_metrics] = run({.micro_batch = 1});
  CHECK(epoch_metrics.at("optimizer_steps") == 4);
}

// The roles' GPU update runs under autocast (float32 masters computing in bf16), which keeps each
// parameter's bf16 cast by tensor, not by value. Every mini-batch must still compute with the
// weights the step before it wrote: the update with autocast's cache on equals, bit for bit, the
// update with it off (every cast made afresh). Before the fix the cached casts outlived the
// optimiser steps, and every mini-batch after the first computed with the weights the update
// started from. On the CPU, whose autocast caches the same way; with activation checkpointing
// too (the recompute in backward casts again).
TEST_CASE("policy update under autocast: every mini-batch computes with the step before's weights",
          "[train][update]") {
  const auto load = [] {
    std::string path = RLHFD_FIXTURES_DIR;
    auto loaded = model::LoadModel(path.append("/models/tiny-qwen2"), {at::kFloat, at::kCPU});
    REQUIRE(loaded.ok());
    return *loaded;
  };
  at::manual_seed(29);
  const int64_t b = 4, t = 8;
  PolicyUpdateBatch batch;
  batch.input_ids = at::randint(3, 500, {b, t}, at::kLong);
  batch.attention_mask = at::ones({b, t}, at::kLong);
  batch.response_mask = at::zeros({b, t - 1});
  batch.response_mask.narrow(1, 3, t - 4).fill_(1);
  batch.advantages = at::randn({b, t - 1}) * batch.response_mask;
  {
    model::Transformer reference = load();
    torch::NoGradGuard no_grad;
    batch.old_log_probs =
        TokenLogProbs(reference->Logits(reference->Hidden({batch.input_ids})).narrow(1, 0, t - 1),
                      batch.input_ids.narrow(1, 1, t - 1));
  }
  PolicyUpdateOptions options;
  options.loop.mini_batch = 2;
  options.loop.epochs = 2;  // four optimiser steps
  options.loop.lr = 1e-2;
  const auto run = [&](bool cache, MicroBatching micro) {
    model::Transformer net = load();
    LocalModel trained(net, {});
    PolicyUpdateOptions o = options;
    o.loop.micro = micro;
    const bool cache_before = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_cache_enabled(cache);
    auto metrics = UpdatePolicy(trained, batch, o);
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::set_autocast_cache_enabled(cache_before);
    at::autocast::clear_cache();
    REQUIRE(metrics.ok());
    return std::make_pair(net, *metrics);
  };
  const auto start = load()->parameters();
  for (const MicroBatching& micro :
       {MicroBatching{.micro_batch = 1},
        MicroBatching{.micro_batch = 1, .activation_checkpointing = true}}) {
    INFO("activation checkpointing " << micro.activation_checkpointing);
    auto [cached, cached_metrics] = run(/*cache=*/true, micro);
    auto [fresh, fresh_metrics] = run(/*cache=*/false, micro);
    double worst = 0, moved = 0;
    for (size_t i = 0; i < start.size(); ++i) {
      worst = std::max(
          worst, (cached->parameters()[i] - fresh->parameters()[i]).abs().max().item<double>());
      moved = std::max(moved, (fresh->parameters()[i] - start[i]).abs().max().item<double>());
    }
    CHECK(worst == 0);
    CHECK(moved > 1e-2);  // four steps of lr 1e-2 moved the weights
    CHECK(cached_metrics.at("approx_kl") == fresh_metrics.at("approx_kl"));
    CHECK(cached_metrics.at("optimizer_steps") == 4);
  }
}

TEST_CASE("an on-policy update without old log-probs takes its own, detached (ratio 1)",
          "[train][update]") {
  // verl's actor with one epoch over one mini-batch: old_log_prob = log_prob.detach(). Against
  // the same update given the model's own log-probs from full logits (float64), the weights
  // agree to rounding; an off-policy update without them is refused.
  auto load = [] { return LoadFloat64Fixture("tiny-qwen2"); };
  at::manual_seed(23);
  const int64_t b = 4, t = 8;
  PolicyUpdateBatch batch;
  batch.input_ids = at::randint(3, 500, {b, t}, at::kLong);
  batch.attention_mask = at::ones({b, t}, at::kLong);
  batch.response_mask = at::zeros({b, t - 1}, at::kDouble);
  batch.response_mask.narrow(1, 3, t - 4).fill_(1);
  batch.advantages = at::randn({b, t - 1}, at::kDouble) * batch.response_mask;
  at::Tensor own;
  {
    model::Transformer reference = load();
    torch::NoGradGuard no_grad;
    own = TokenLogProbs(reference->Logits(reference->Hidden({batch.input_ids})).narrow(1, 0, t - 1),
                        batch.input_ids.narrow(1, 1, t - 1));
  }
  PolicyUpdateOptions options;
  options.loop.mini_batch = b;
  options.loop.lr = 1e-3;
  options.loop.micro = {.micro_batch = 2};
  options.entropy_coeff = 0.01;
  auto run = [&](const at::Tensor& old_log_probs) {
    model::Transformer net = load();
    LocalModel trained(net, {});
    PolicyUpdateBatch given = batch;
    given.old_log_probs = old_log_probs;
    auto metrics = UpdatePolicy(trained, given, options);
    REQUIRE(metrics.ok());
    return std::make_pair(net, *metrics);
  };
  auto [detached, detached_metrics] = run(at::Tensor());
  auto [given, given_metrics] = run(own);
  double worst = 0, moved = 0;
  const auto start = load()->parameters();
  for (size_t i = 0; i < start.size(); ++i) {
    worst = std::max(
        worst, (detached->parameters()[i] - given->parameters()[i]).abs().max().item<double>());
    moved = std::max(moved, (detached->parameters()[i] - start[i]).abs().max().item<double>());
  }
  CHECK(worst <= 1e-10);
  CHECK(moved > 1e-4);  // The update did something.
  CHECK(detached_metrics.at("approx_kl") == 0);
  CHECK(detached_metrics.at("clip_fraction") == 0);
  CHECK(detached_metrics.at("policy_loss") ==
        Approx(given_metrics.at("policy_loss")).margin(1e-10));

  options.loop.epochs = 2;
  model::Transformer net = load();
  LocalModel trained(net, {});
  const auto refused = UpdatePolicy(trained, batch, options);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("old_log_probs"));
}

TEST_CASE("a supervised update (trainer.mode sft) minimises the response tokens' NLL",
          "[train][update]") {
  // Its loss is the token mean of -log p over the response mask, here against log-probs from the
  // full logits (float64), with two rows per micro-batch. Its gradient is the policy gradient's
  // with advantages 1 at ratio 1 (-d/dθ exp(log p - sg(log p)) = -d/dθ log p), so the weights
  // after a step equal those of that on-policy update, made through the PPO loss. It needs
  // neither advantages nor old log-probs, whatever the epochs.
  auto load = [] { return LoadFloat64Fixture("tiny-qwen2"); };
  at::manual_seed(29);
  const int64_t b = 4, t = 9;
  PolicyUpdateBatch batch;
  batch.input_ids = at::randint(3, 500, {b, t}, at::kLong);
  batch.attention_mask = at::ones({b, t}, at::kLong);
  batch.response_mask = at::zeros({b, t - 1}, at::kDouble);
  batch.response_mask.narrow(1, 2, t - 3).fill_(1);
  batch.response_mask[1][4] = 0;  // a tool's token inside a response
  double nll = 0;
  {
    model::Transformer reference = load();
    torch::NoGradGuard no_grad;
    const at::Tensor own =
        TokenLogProbs(reference->Logits(reference->Hidden({batch.input_ids})).narrow(1, 0, t - 1),
                      batch.input_ids.narrow(1, 1, t - 1));
    nll = -(own * batch.response_mask).sum().item<double>() /
          batch.response_mask.sum().item<double>();
  }
  PolicyUpdateOptions options;
  options.loop.mini_batch = b;
  options.loop.lr = 1e-3;
  options.loop.micro = {.micro_batch = 2};
  auto run = [&](const PolicyUpdateBatch& given, const PolicyUpdateOptions& with) {
    model::Transformer net = load();
    LocalModel trained(net, {});
    auto metrics = UpdatePolicy(trained, given, with);
    REQUIRE(metrics.ok());
    return std::make_pair(net, *metrics);
  };
  PolicyUpdateOptions supervised = options;
  supervised.supervised = true;
  auto [sft, sft_metrics] = run(batch, supervised);
  CHECK(sft_metrics.at("sft_loss") == Approx(nll).epsilon(1e-12));
  CHECK(sft_metrics.count("policy_loss") == 0);

  PolicyUpdateBatch ones = batch;
  ones.advantages = batch.response_mask.clone();
  auto [ppo, ppo_metrics] = run(ones, options);
  double worst = 0, moved = 0;
  const auto start = load()->parameters();
  for (size_t i = 0; i < start.size(); ++i) {
    worst =
        std::max(worst, (sft->parameters()[i] - ppo->parameters()[i]).abs().max().item<double>());
    moved = std::max(moved, (sft->parameters()[i] - start[i]).abs().max().item<double>());
  }
  CHECK(worst <= 1e-10);
  CHECK(moved > 1e-4);

  supervised.loop.epochs = 2;
  supervised.loop.mini_batch = 2;
  auto [twice, twice_metrics] = run(batch, supervised);
  CHECK(twice_metrics.at("optimizer_steps") == 4);
  CHECK(std::isfinite(twice_metrics.at("sft_loss")));
}

TEST_CASE("a malformed batch is refused naming the tensor", "[train][update]") {
  auto loaded = model::LoadModel(std::string(RLHFD_FIXTURES_DIR) + "/models/tiny-qwen2",
                                 {at::kDouble, at::kCPU});
  REQUIRE(loaded.ok());
  model::Transformer net = *loaded;
  LocalModel trained(net, {});
  PolicyUpdateBatch batch;
  batch.input_ids = at::randint(3, 500, {2, 5}, at::kLong);
  batch.response_mask = at::ones({2, 4}, at::kDouble);
  batch.old_log_probs = at::zeros({2, 4}, at::kDouble);
  batch.advantages = at::zeros({2, 3}, at::kDouble);
  PolicyUpdateOptions options;
  auto refused = UpdatePolicy(trained, batch, options);
  CHECK(absl::IsInvalidArgument(refused.status()));
  CHECK_THAT(std::string(refused.status().message()), Catch::Contains("advantages must be (2, 4)"));
  batch.advantages = at::zeros({2, 4}, at::kDouble);
  batch.input_ids[1][2] = 100000;
  refused = UpdatePolicy(trained, batch, options);
  CHECK_THAT(std::string(refused.status().message()),
             Catch::Contains("token id 100000 is outside the model's vocabulary"));
  batch.input_ids[1][2] = 7;
  options.kl_coef = 0.1;  // A KL loss needs reference log-probs.
  CHECK_THAT(std::string(UpdatePolicy(trained, batch, options).status().message()),
             Catch::Contains("ref_log_probs must be (2, 4)"));
  // A critic update on a model without a score head.
  CriticUpdateBatch critic;
  critic.input_ids = batch.input_ids;
  CHECK_THAT(std::string(UpdateCritic(trained, critic, {}).status().message()),
             Catch::Contains("needs a model with a one-label score head"));
}

TEST_CASE("micro-batches by a token budget", "[train][update]") {
  const std::vector<int64_t> tokens = {5, 9, 3, 7, 2, 12, 4};
  const std::vector<int64_t> rows = {6, 0, 1, 2, 3, 4, 5};
  const auto batches = SplitMicroBatches(rows, tokens, /*rows_per_micro_batch=*/2, /*budget=*/10);
  std::vector<int64_t> seen;
  for (const auto& batch : batches) {
    int64_t sum = 0;
    for (int64_t row : batch) sum += tokens[row];
    CHECK((sum <= 10 || batch.size() == 1));  // Row 5 (12 tokens) goes alone.
    // Rows keep the input order inside a micro-batch.
    std::vector<size_t> where;
    for (int64_t row : batch)
      where.push_back(std::find(rows.begin(), rows.end(), row) - rows.begin());
    CHECK(std::is_sorted(where.begin(), where.end()));
    seen.insert(seen.end(), batch.begin(), batch.end());
  }
  std::sort(seen.begin(), seen.end());
  CHECK(seen == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6});  // Every row exactly once.
  // First-fit by decreasing tokens: 12 | 9 | 7+3 | 5+4 | 2.
  CHECK(batches.size() == 5);
  // Without a budget: fixed row counts, in order.
  CHECK(SplitMicroBatches(rows, tokens, 3, 0) ==
        std::vector<std::vector<int64_t>>{{6, 0, 1}, {2, 3, 4}, {5}});
}

TEST_CASE("micro-batches by a token budget keep a prompt's samples together", "[train][update]") {
  // Runs of 2 entries: {8, 9} 6 tokens, {2, 3} 13 (over the budget of 10: row 2 (6) and row 3
  // (7) alone), {4, 5} 9, {0, 1} 5. First fit by decreasing count: {4, 5} | 3 | {8, 9} | 2 |
  // {0, 1} (no two of the rest fit together).
  const std::vector<int64_t> tokens = {2, 3, 6, 7, 4, 5, 0, 0, 2, 4};
  const std::vector<int64_t> rows = {8, 9, 2, 3, 4, 5, 0, 1};
  const auto batches = SplitMicroBatches(rows, tokens, 1, /*budget=*/10, /*group=*/2);
  CHECK(batches == std::vector<std::vector<int64_t>>{{4, 5}, {3}, {8, 9}, {2}, {0, 1}});
  // Rows that do not divide into groups: row by row, as without groups.
  const std::vector<int64_t> odd = {8, 9, 2};
  CHECK(SplitMicroBatches(odd, tokens, 1, 10, 2) == SplitMicroBatches(odd, tokens, 1, 10));
}

}  // namespace
}  // namespace rlhfd::train
