// Every loss aggregation mode equals verl's agg_loss over the whole mini-batch, in value and
// gradient, whatever the micro-batching (token budgets and packing included).
#include <ATen/ATen.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tests/unit/train/train_test_support.h"
#include "worker/train/log_probs.h"
#include "worker/train/policy_update.h"

namespace rlhfd::train {
namespace {

using testing::LoadFloat64Fixture;
using testing::Matrix;
using testing::ToMatrix;

// verl's agg_loss over a whole mini-batch (verl >= 0.9 with global batch information), written
// out with loops: rows without response tokens count in no denominator.
double VerlAggregate(const Matrix& loss, const Matrix& mask, v1::LossAggregation mode,
                     double horizon) {
  double total = 0, tokens = 0, sequences = 0, seq_sum = 0, seq_mean = 0;
  for (size_t i = 0; i < loss.size(); ++i) {
    double row_sum = 0, row_tokens = 0;
    for (size_t j = 0; j < loss[i].size(); ++j) {
      row_sum += loss[i][j] * mask[i][j];
      row_tokens += mask[i][j];
    }
    total += row_sum;
    tokens += row_tokens;
    if (row_tokens > 0) {
      sequences += 1;
      seq_sum += row_sum;
      seq_mean += row_sum / row_tokens;
    }
  }
  switch (mode) {
    case v1::LOSS_AGGREGATION_TOKEN_MEAN:
      return total / tokens;
    case v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM:
      return seq_sum / sequences;
    case v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN:
      return seq_mean / sequences;
    case v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM_NORM:
      return total / (sequences * horizon);
    default:
      FAIL("unknown mode");
      return 0;
  }
}

TEST_CASE("every loss aggregation equals verl's over the mini-batch, whatever the micro-batches",
          "[train][update][aggregation]") {
  // Aggregation of the masked PPO loss, checked in value and gradient against verl's formulas:
  // a float64 reference loss (per-token PPO loss, entropy bonus and k3 KL loss, each aggregated
  // over the whole batch by VerlAggregate) differentiated by autograd, against the gradient
  // UpdatePolicy accumulates (lr 0, no clipping) with each micro-batching.
  auto load = [] { return LoadFloat64Fixture("tiny-qwen2"); };
  at::manual_seed(31);
  const int64_t b = 6, t = 9;
  // Row 2 has no response token at all; row 4 has one.
  const std::vector<int64_t> lengths = {9, 7, 6, 9, 5, 8};
  const std::vector<int64_t> response_tokens = {5, 3, 0, 4, 1, 4};
  PolicyUpdateBatch batch;
  batch.input_ids = at::randint(3, 500, {b, t}, at::kLong);
  batch.attention_mask = at::zeros({b, t}, at::kLong);
  batch.response_mask = at::zeros({b, t - 1}, at::kDouble);
  for (int64_t i = 0; i < b; ++i) {
    batch.attention_mask[i].narrow(0, 0, lengths[i]).fill_(1);
    if (response_tokens[i] > 0) {
      batch.response_mask[i]
          .narrow(0, lengths[i] - 1 - response_tokens[i], response_tokens[i])
          .fill_(1);
    }
  }
  batch.advantages = at::randn({b, t - 1}, at::kDouble);
  {
    model::Transformer reference = load();
    torch::NoGradGuard no_grad;
    at::Tensor logits =
        reference->Logits(reference->Hidden({batch.input_ids, batch.attention_mask}))
            .narrow(1, 0, t - 1);
    // Old log-probs away from the current ones, so that some ratios clip.
    batch.old_log_probs = TokenLogProbs(logits, batch.input_ids.narrow(1, 1, t - 1)) +
                          0.3 * at::randn({b, t - 1}, at::kDouble);
  }
  batch.ref_log_probs = batch.old_log_probs + 0.05 * at::randn({b, t - 1}, at::kDouble);
  const double low = 0.2, high = 0.28, c = 3.0, entropy_coeff = 0.01, kl_coef = 0.1;
  const double horizon = 11;  // data.max_response_length: longer than any response here
  const Matrix mask = ToMatrix(batch.response_mask);

  for (const v1::LossAggregation mode :
       {v1::LOSS_AGGREGATION_TOKEN_MEAN, v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM,
        v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN, v1::LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM_NORM}) {
    INFO(v1::LossAggregation_Name(mode));
    // The reference: full padded forward, per-token terms from full logits, verl's aggregation.
    model::Transformer reference = load();
    at::Tensor logits =
        reference->Logits(reference->Hidden({batch.input_ids, batch.attention_mask}))
            .narrow(1, 0, t - 1);
    const at::Tensor log_probs = at::log_softmax(logits, -1);
    const at::Tensor log_prob =
        log_probs.gather(-1, batch.input_ids.narrow(1, 1, t - 1).unsqueeze(-1)).squeeze(-1);
    const at::Tensor entropy = -(log_probs.exp() * log_probs).sum(-1);
    const at::Tensor ratio = (log_prob - batch.old_log_probs).clamp(-20, 20).exp();
    const at::Tensor& a = batch.advantages;
    const at::Tensor clip1 = at::maximum(-a * ratio, -a * ratio.clamp(1 - low, 1 + high));
    const at::Tensor pg = at::where(a.lt(0), at::minimum(clip1, -a * c), clip1);
    const at::Tensor delta = (batch.ref_log_probs - log_prob).clamp(-20, 20);
    const at::Tensor kl = (delta.exp() - delta - 1).clamp(-10, 10);
    // VerlAggregate is linear in the loss: aggregate with weights, then differentiate.
    const auto aggregate = [&](const at::Tensor& per_token) {
      at::Tensor total = at::zeros({}, at::kDouble);
      Matrix unit(b, std::vector<double>(t - 1, 0.0));
      for (int64_t i = 0; i < b; ++i) {
        for (int64_t j = 0; j < t - 1; ++j) {
          unit[i][j] = 1;
          const double weight = VerlAggregate(unit, mask, mode, horizon);
          unit[i][j] = 0;
          if (weight != 0) total = total + weight * per_token[i][j];
        }
      }
      return total;
    };
    const at::Tensor pg_loss = aggregate(pg);
    const at::Tensor total = pg_loss - entropy_coeff * aggregate(entropy) + kl_coef * aggregate(kl);
    total.backward();
    CHECK(pg_loss.item<double>() ==
          Approx(VerlAggregate(ToMatrix(pg.detach()), mask, mode, horizon)).epsilon(1e-12));

    for (const auto& [name, micro] : std::vector<std::pair<const char*, MicroBatching>>{
             {"one micro-batch", {.micro_batch = 6}},
             {"one row each", {.micro_batch = 1}},
             {"two rows each", {.micro_batch = 2}},
             {"token budget of 14", {.micro_batch_tokens = 14}},
             {"packed, three rows each", {.micro_batch = 3, .packed = true}},
             {"packed with a token budget", {.micro_batch_tokens = 16, .packed = true}}}) {
      INFO(name);
      model::Transformer net = load();
      LocalModel trained(net, {});
      PolicyUpdateOptions options;
      options.loop.mini_batch = b;
      options.loop.lr = 0;
      options.loop.grad_clip = 0;
      options.loop.loss_horizon = horizon;
      options.loop.micro = micro;
      options.policy = {
          .clip_ratio_low = low, .clip_ratio_high = high, .clip_ratio_c = c, .aggregation = mode};
      options.entropy_coeff = entropy_coeff;
      options.kl_coef = kl_coef;
      options.kl_estimator = v1::KL_ESTIMATOR_K3;
      auto metrics = UpdatePolicy(trained, batch, options);
      REQUIRE(metrics.ok());
      CHECK(metrics->at("policy_loss") == Approx(pg_loss.item<double>()).epsilon(1e-10));
      double worst = 0, largest = 0;
      auto ours = net->parameters(), theirs = reference->parameters();
      for (size_t i = 0; i < ours.size(); ++i) {
        worst = std::max(worst, (ours[i].grad() - theirs[i].grad()).abs().max().item<double>());
        largest = std::max(largest, theirs[i].grad().abs().max().item<double>());
      }
      INFO("largest gradient " << largest << ", largest difference " << worst);
      CHECK(largest > 1e-4);
      CHECK(worst <= 1e-10);
    }
  }
}

}  // namespace
}  // namespace rlhfd::train
