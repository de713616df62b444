// Non-finite values: FirstNonFinite, a NaN loss failing the update with no weight changed,
// trainer.max_nonfinite_skips, a NaN gradient naming where the backward broke, and an overflowing
// update naming the parameter.
#include <ATen/ATen.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tests/unit/train/train_test_support.h"
#include "worker/train/finite_check.h"
#include "worker/train/policy_update.h"

namespace rlhfd::train {
namespace {

using testing::LoadFloat64Fixture;

TEST_CASE("FirstNonFinite finds the first tensor with a NaN or an infinity", "[train][nonfinite]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<at::Tensor> tensors = {at::ones({3}),
                                     at::arange(5, at::kLong),
                                     at::Tensor(),
                                     at::zeros({0}),
                                     at::full({2, 2}, 1e30, at::kDouble),
                                     at::ones({4})};
  CHECK_FALSE(FirstNonFinite(tensors).has_value());  // huge is still finite
  CHECK_FALSE(FirstNonFinite({}).has_value());
  tensors[5][2] = std::numeric_limits<float>::infinity();
  CHECK(FirstNonFinite(tensors) == 5u);
  tensors[4][1][0] = nan;
  CHECK(FirstNonFinite(tensors) == 4u);
  tensors[0][0] = -std::numeric_limits<float>::infinity();
  CHECK(FirstNonFinite(tensors) == 0u);
}

// A float64 batch for the tiny Qwen2 fixture whose rows `bad_rows` have NaN advantages.
PolicyUpdateBatch NonFiniteBatch(const std::vector<int64_t>& bad_rows) {
  at::manual_seed(31);
  const int64_t b = 4, t = 8;
  PolicyUpdateBatch batch;
  batch.input_ids = at::randint(3, 500, {b, t}, at::kLong);
  batch.attention_mask = at::ones({b, t}, at::kLong);
  batch.response_mask = at::zeros({b, t - 1}, at::kDouble);
  batch.response_mask.narrow(1, 3, t - 4).fill_(1);
  batch.advantages = at::randn({b, t - 1}, at::kDouble) * batch.response_mask;
  for (int64_t row : bad_rows) batch.advantages[row][4] = std::numeric_limits<double>::quiet_NaN();
  return batch;
}

TEST_CASE("a non-finite loss fails the update naming it; no weight changes", "[train][nonfinite]") {
  model::Transformer net = LoadFloat64Fixture("tiny-qwen2");
  const std::vector<at::Tensor> before = [&] {
    std::vector<at::Tensor> copies;
    for (const at::Tensor& p : net->parameters()) copies.push_back(p.detach().clone());
    return copies;
  }();
  LocalModel trained(net, {});
  PolicyUpdateOptions options;
  options.loop.mini_batch = 4;
  options.loop.lr = 1e-3;
  options.loop.role = "actor";
  const auto failed = UpdatePolicy(trained, NonFiniteBatch({2}), options);
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.status().code() == absl::StatusCode::kFailedPrecondition);
  const std::string message(failed.status().message());
  INFO(message);
  CHECK_THAT(message, Catch::Contains("actor: optimizer step 1 of this update"));
  CHECK_THAT(message, Catch::Contains("policy_loss is NaN"));
  CHECK_THAT(message, Catch::Contains("no update was applied"));
  CHECK_THAT(message, Catch::Contains("trainer.max_nonfinite_skips (0)"));
  const std::vector<at::Tensor> after = net->parameters();
  for (size_t i = 0; i < after.size(); ++i) CHECK(at::equal(after[i], before[i]));
  for (const at::Tensor& p : after) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("trainer.max_nonfinite_skips skips that many non-finite steps, then fails",
          "[train][nonfinite]") {
  // Two mini-batches of two rows; one holds the NaN row.
  PolicyUpdateOptions options;
  options.loop.mini_batch = 2;
  options.loop.lr = 1e-3;
  options.loop.role = "actor";
  options.loop.max_nonfinite_skips = 1;
  model::Transformer net = LoadFloat64Fixture("tiny-qwen2");
  const model::Transformer start = LoadFloat64Fixture("tiny-qwen2");
  LocalModel trained(net, {});
  PolicyUpdateBatch batch = NonFiniteBatch({1});
  batch.old_log_probs = at::full({4, 7}, -6.0, at::kDouble);  // off-policy: two mini-batches
  const auto skipped = UpdatePolicy(trained, batch, options);
  INFO(skipped.status().message());
  REQUIRE(skipped.ok());
  CHECK(skipped->at("nonfinite_skips") == 1);
  CHECK(skipped->at("optimizer_steps") == 2);
  // The skipped step's values are averaged in as they are: the means show it.
  CHECK(std::isnan(skipped->at("policy_loss")));
  CHECK(std::isnan(skipped->at("grad_norm")));
  // The other mini-batch's step was taken, and the weights are finite.
  double moved = 0;
  for (size_t i = 0; i < net->parameters().size(); ++i) {
    CHECK(at::isfinite(net->parameters()[i]).all().item<bool>());
    moved =
        std::max(moved, (net->parameters()[i] - start->parameters()[i]).abs().max().item<double>());
  }
  CHECK(moved > 1e-5);
  // The run has used its one skip: the next non-finite step fails.
  options.loop.nonfinite_skips_before = 1;
  const auto failed = UpdatePolicy(trained, batch, options);
  REQUIRE_FALSE(failed.ok());
  CHECK_THAT(std::string(failed.status().message()),
             Catch::Contains("trainer.max_nonfinite_skips (1) allows no more skipped steps (1 so "
                             "far)"));
}

TEST_CASE("a finite loss with a non-finite gradient fails naming where the backward broke",
          "[train][nonfinite]") {
  // A hook on layer 1's output turns the gradient flowing into it NaN while the loss stays
  // finite (as a backward that overflows where the forward did not would): the NaN spreads to
  // layer 1's parameters and everything before it (layer 0, the embeddings); layer 1 is named,
  // its last parameter in forward order, the first the backward reached.
  model::Transformer net = LoadFloat64Fixture("tiny-qwen2");
  net->set_layer_runner([](int64_t index, model::DecoderLayerImpl& layer, const at::Tensor& x,
                           const model::AttentionContext& context) {
    at::Tensor out = layer.forward(x, context);
    if (index == 1 && out.requires_grad()) {
      out.register_hook(
          [](const at::Tensor& grad) { return grad * std::numeric_limits<double>::quiet_NaN(); });
    }
    return out;
  });
  std::string last_of_layer_1;
  for (const auto& item : net->named_parameters()) {
    if (item.key().rfind("model.layers.1.", 0) == 0) last_of_layer_1 = item.key();
  }
  LocalModel trained(net, {});
  PolicyUpdateOptions options;
  options.loop.mini_batch = 4;
  options.loop.lr = 1e-3;
  options.loop.role = "actor";
  const auto failed = UpdatePolicy(trained, NonFiniteBatch({}), options);
  REQUIRE_FALSE(failed.ok());
  const std::string message(failed.status().message());
  INFO(message);
  CHECK_THAT(message, Catch::Contains("grad_norm is NaN (the backward went non-finite at " +
                                      last_of_layer_1 + ")"));
  CHECK_THAT(message, Catch::Contains("no update was applied"));
  for (const at::Tensor& p : net->parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("an update that overflows the weights fails naming a parameter", "[train][nonfinite]") {
  // float32 weights: lr 1e39 is infinite in the fused AdamW kernel's float arithmetic.
  auto loaded = model::LoadModel(std::string(RLHFD_FIXTURES_DIR) + "/models/tiny-qwen2",
                                 {at::kFloat, at::kCPU});
  REQUIRE(loaded.ok());
  model::Transformer net = *loaded;
  LocalModel trained(net, {});
  PolicyUpdateBatch batch = NonFiniteBatch({});
  batch.advantages = batch.advantages.to(at::kFloat);
  batch.response_mask = batch.response_mask.to(at::kFloat);
  PolicyUpdateOptions options;
  options.loop.mini_batch = 4;
  options.loop.lr = 1e39;
  options.loop.role = "actor";
  options.loop.max_nonfinite_skips = 5;  // an overflowed weight is never skipped
  const auto failed = UpdatePolicy(trained, batch, options);
  REQUIRE_FALSE(failed.ok());
  const std::string message(failed.status().message());
  INFO(message);
  CHECK_THAT(message, Catch::Contains("actor: optimizer step 1 of this update"));
  CHECK_THAT(message, Catch::Contains("parameter model."));
  CHECK_THAT(message, Catch::Contains("holds non-finite values after the update (lr 1e+39"));
  CHECK_THAT(message, Catch::Contains("lower roles.actor.train.lr"));
}

}  // namespace
}  // namespace rlhfd::train
