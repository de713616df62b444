// The critic: explained variance hand-worked, and the value update (the loss falls over epochs;
// accumulation and packing give the same update in float64).
#include "worker/train/critic_update.h"

#include <ATen/ATen.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tests/unit/train/train_test_support.h"

namespace rlhfd::train {
namespace {

using testing::LoadFloat64Fixture;
using testing::ToTensor;

TEST_CASE("explained variance, hand-worked", "[train][critic]") {
  const at::Tensor returns = ToTensor({{1, 2, 3, 4, 9}});
  const at::Tensor mask = ToTensor({{1, 1, 1, 1, 0}});
  // error = r - v = (0, 0, 0, -1): its variance 0.1875, the returns' 1.25.
  CHECK(ExplainedVariance(ToTensor({{1, 2, 3, 5, 0}}), returns, mask) == Approx(0.85));
  CHECK(ExplainedVariance(returns, returns, mask) == Approx(1.0));
  CHECK(ExplainedVariance(at::full_like(returns, 2.5), returns, mask) == Approx(0.0));
  CHECK(ExplainedVariance(returns, at::ones_like(returns), mask) == 0.0);  // Constant returns.
}

TEST_CASE("critic update: value loss falls, accumulation and packing change nothing",
          "[train][critic]") {
  auto load = [] { return LoadFloat64Fixture("tiny-llama-value"); };
  at::manual_seed(8);
  const int64_t b = 4, t = 7;
  CriticUpdateBatch batch;
  batch.input_ids = at::randint(3, 500, {b, t}, at::kLong);
  batch.attention_mask = at::ones({b, t}, at::kLong);
  batch.attention_mask[3].narrow(0, 5, 2).fill_(0);
  batch.response_mask = at::zeros({b, t - 1}, at::kDouble);
  batch.response_mask.narrow(1, 2, 4).fill_(1);
  batch.response_mask[3].narrow(0, 4, 2).fill_(0);
  batch.returns = at::randn({b, t - 1}, at::kDouble) * batch.response_mask;
  {
    model::Transformer reference = load();
    torch::NoGradGuard no_grad;
    batch.old_values = reference->Scores(reference->Hidden({batch.input_ids, batch.attention_mask}))
                           .squeeze(-1)
                           .narrow(1, 0, t - 1);
  }
  CriticUpdateOptions options;
  options.loop.mini_batch = 4;
  options.loop.lr = 1e-2;
  options.value_clip = 10.0;  // Let the values move freely here.
  auto run = [&](MicroBatching micro, int64_t epochs) {
    model::Transformer net = load();
    LocalModel trained(net, {});
    CriticUpdateOptions o = options;
    o.loop.micro = micro;
    o.loop.epochs = epochs;
    auto metrics = UpdateCritic(trained, batch, o);
    REQUIRE(metrics.ok());
    return std::make_pair(net, *metrics);
  };
  auto [whole, whole_metrics] = run({.micro_batch = 4}, 1);
  for (MicroBatching micro :
       {MicroBatching{.micro_batch = 1}, MicroBatching{.micro_batch = 2, .packed = true}}) {
    auto [net, metrics] = run(micro, 1);
    double worst = 0;
    auto a = whole->parameters(), c = net->parameters();
    for (size_t i = 0; i < a.size(); ++i)
      worst = std::max(worst, (a[i] - c[i]).abs().max().item<double>());
    CHECK(worst <= 1e-10);
    CHECK(metrics.at("explained_variance") ==
          Approx(whole_metrics.at("explained_variance")).epsilon(1e-9));
  }
  for (const char* name : {"value_loss", "value_clip_fraction", "values", "explained_variance",
                           "grad_norm", "lr", "optimizer_steps", "response_tokens_per_s"}) {
    CHECK(whole_metrics.count(name) == 1);
  }
  // Twenty epochs on the same batch: the values fit the returns better.
  auto [trained, trained_metrics] = run({.micro_batch = 4}, 20);
  torch::NoGradGuard no_grad;
  const at::Tensor values =
      trained->Scores(trained->Hidden({batch.input_ids, batch.attention_mask}))
          .squeeze(-1)
          .narrow(1, 0, t - 1);
  const double before = ExplainedVariance(batch.old_values, batch.returns, batch.response_mask);
  const double after = ExplainedVariance(values, batch.returns, batch.response_mask);
  INFO("explained variance " << before << " -> " << after);
  CHECK(after > before + 0.3);
  CHECK(trained_metrics.at("value_loss") < whole_metrics.at("value_loss"));
}

}  // namespace
}  // namespace rlhfd::train
