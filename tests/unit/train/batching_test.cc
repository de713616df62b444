// How a micro-batch is packed (PlanPackedRows, by hand) and what ForwardMicroBatch returns: rows
// sharing a prompt computed once, and only the scored positions, give the log-probs and the
// gradients of each row computed whole and padded (the independent reference), in float64.
#include "worker/train/batching.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <vector>

#include "tests/unit/train/train_test_support.h"
#include "worker/train/chunked_log_probs.h"
#include "worker/train/trained_model.h"
#include "worker/train/update_loop.h"

namespace rlhfd::train {
namespace {

using testing::LoadFloat64Fixture;

std::vector<int64_t> Range(int64_t from, int64_t to) {
  std::vector<int64_t> values;
  for (int64_t v = from; v < to; ++v) values.push_back(v);
  return values;
}

TEST_CASE("rows that begin alike compute their common prefix once", "[train][packing]") {
  // Three rows of T = 24, all real: row 1 repeats row 0's first 20 tokens, row 2 row 1's first
  // 22 (and so row 0's first 20), row 3 shares less than kMinSharedPrefix with anything.
  const int64_t n = 4, t = 24;
  std::vector<int64_t> ids(n * t);
  for (int64_t c = 0; c < t; ++c) {
    ids[c] = 100 + c;
    ids[t + c] = c < 20 ? 100 + c : 200 + c;
    ids[2 * t + c] = c < 22 ? ids[t + c] : 300 + c;
    ids[3 * t + c] = c < kMinSharedPrefix - 1 ? 100 + c : 400 + c;
  }
  std::vector<char> real(n * t, 1);
  const PackedRows plan = PlanPackedRows(ids.data(), reinterpret_cast<const bool*>(real.data()),
                                         nullptr, n, t, /*share=*/true);
  // Own tokens: 24, 4 (20..23), 2 (22..23), 24.
  CHECK(plan.starts == std::vector<int64_t>{0, 24, 28, 30, 54});
  CHECK(plan.max_length == 24);
  CHECK(plan.max_keys == 24);
  CHECK(plan.key_starts == std::vector<int64_t>{0, 24, 48, 72, 96});
  std::vector<int64_t> keys = Range(0, 24);           // row 0: itself
  for (int64_t v : Range(0, 20)) keys.push_back(v);   // row 1: row 0's 20,
  for (int64_t v : Range(24, 28)) keys.push_back(v);  // then its own 4
  for (int64_t v : Range(0, 20)) keys.push_back(v);   // row 2: row 0's 20,
  for (int64_t v : Range(24, 26)) keys.push_back(v);  // row 1's 2,
  for (int64_t v : Range(28, 30)) keys.push_back(v);  // its own 2
  for (int64_t v : Range(30, 54)) keys.push_back(v);  // row 3: itself
  CHECK(plan.key_index == keys);
  // Packed tokens: row 1's own are its columns 20..23 at positions 20..23.
  CHECK(plan.tokens[24] == t + 20);
  CHECK(plan.positions[24] == 20);
  CHECK(plan.tokens[28] == 2 * t + 22);
  CHECK(plan.positions[29] == 23);
  // Every position of every row scored (23 a row), from the hidden state its key names.
  REQUIRE(plan.scored.size() == 4 * 23);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t p = 0; p < 23; ++p) {
      CHECK(plan.scored[i * 23 + p] == keys[i * 24 + p]);
      CHECK(plan.targets[i * 23 + p] == i * t + p + 1);
      CHECK(plan.rows[i * 23 + p] == i);
      CHECK(plan.columns[i * 23 + p] == p);
    }
  }

  SECTION("without sharing every row is its own") {
    const PackedRows alone = PlanPackedRows(ids.data(), reinterpret_cast<const bool*>(real.data()),
                                            nullptr, n, t, false);
    CHECK(alone.key_index.empty());
    CHECK(alone.starts == std::vector<int64_t>{0, 24, 48, 72, 96});
    std::vector<int64_t> own;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t v : Range(i * 24, i * 24 + 23)) own.push_back(v);
    }
    CHECK(alone.scored == own);
  }

  SECTION("a row identical to an earlier one keeps its last token") {
    std::vector<int64_t> twice(ids.begin(), ids.begin() + t);
    twice.insert(twice.end(), ids.begin(), ids.begin() + t);
    const PackedRows plan_twice = PlanPackedRows(
        twice.data(), reinterpret_cast<const bool*>(real.data()), nullptr, 2, t, true);
    CHECK(plan_twice.starts == std::vector<int64_t>{0, 24, 25});
    CHECK(plan_twice.positions.back() == 23);
  }
}

TEST_CASE("a prefix is shared from exactly kMinSharedPrefix tokens on", "[train][packing]") {
  // T = 20: row 0 tokens 100…119; row 1 its first 16, then others; row 2 its first 17 and no
  // more (a strict prefix of row 0); row 3 its first 16 and no more (too short to share: a row
  // keeps a token of its own); row 4 as row 2.
  const int64_t n = 5, t = 20;
  std::vector<int64_t> ids(n * t, 0);
  std::vector<char> real(n * t, 0);
  const std::vector<int64_t> lengths = {20, 20, 17, 16, 17};
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < lengths[i]; ++c) {
      ids[i * t + c] = i == 1 && c >= 16 ? 500 + c : 100 + c;
      real[i * t + c] = 1;
    }
  }
  const PackedRows plan = PlanPackedRows(ids.data(), reinterpret_cast<const bool*>(real.data()),
                                         nullptr, n, t, /*share=*/true);
  // Own tokens: 20, 4, 1, 16, 1.
  CHECK(plan.starts == std::vector<int64_t>{0, 20, 24, 25, 41, 42});
  CHECK(plan.positions[20] == 16);
  CHECK(plan.positions[24] == 16);
  CHECK(plan.positions[25] == 0);
  CHECK(plan.positions[41] == 16);
  // Row 4's last position (16) is its own token; position 15 reads row 0's.
  CHECK(plan.key_index[plan.key_starts[4] + 16] == 41);
  CHECK(plan.key_index[plan.key_starts[4] + 15] == 15);
}

TEST_CASE("only the scored positions are returned, where their next token is real",
          "[train][packing]") {
  // Row 0: left padding 2, tokens at columns 2..7; row 1: tokens at 0..4, right padding.
  const int64_t n = 2, t = 8;
  std::vector<int64_t> ids(n * t, 0);
  std::vector<char> real(n * t, 0), scored(n * (t - 1), 0);
  for (int64_t c = 2; c < 8; ++c) real[c] = 1;
  for (int64_t c = 0; c < 5; ++c) real[t + c] = 1;
  for (int64_t c = 3; c < 7; ++c) scored[c] = scored[(t - 1) + c] = 1;  // columns 3..6
  const PackedRows plan =
      PlanPackedRows(ids.data(), reinterpret_cast<const bool*>(real.data()),
                     reinterpret_cast<const bool*>(scored.data()), n, t, /*share=*/false);
  // Row 0: columns 3..6 (all predict a real token); row 1: columns 3 only (4 predicts padding).
  CHECK(plan.rows == std::vector<int64_t>{0, 0, 0, 0, 1});
  CHECK(plan.columns == std::vector<int64_t>{3, 4, 5, 6, 3});
  CHECK(plan.scored == std::vector<int64_t>{1, 2, 3, 4, 9});
  CHECK(plan.targets == std::vector<int64_t>{4, 5, 6, 7, t + 4});
}

// A GRPO-shaped batch: 3 prompts (left-padded, 18 to 20 tokens) × 3 samples (right-padded
// responses of 2 to 6 tokens), the samples of a prompt in consecutive rows.
struct GroupBatch {
  at::Tensor ids, attention, response;  // (9, 26), (9, 26), (9, 25) in the (n, T-1) layout
};

GroupBatch MakeGroupBatch() {
  at::manual_seed(5);
  const int64_t prompt_width = 20, response_width = 6, t = prompt_width + response_width;
  const std::vector<int64_t> prompt_lengths = {20, 18, 19},
                             response_lengths = {6, 2, 5, 3, 6, 4, 1, 6, 5};
  GroupBatch batch{at::zeros({9, t}, at::kLong), at::zeros({9, t}, at::kLong),
                   at::zeros({9, t - 1}, at::kDouble)};
  for (int64_t g = 0; g < 3; ++g) {
    const at::Tensor prompt = at::randint(3, 500, {prompt_lengths[g]}, at::kLong);
    for (int64_t s = 0; s < 3; ++s) {
      const int64_t row = 3 * g + s, length = response_lengths[row];
      const int64_t first = prompt_width - prompt_lengths[g];
      batch.ids[row].narrow(0, first, prompt_lengths[g]).copy_(prompt);
      batch.ids[row].narrow(0, prompt_width, length).copy_(at::randint(3, 500, {length}));
      batch.attention[row].narrow(0, first, prompt_lengths[g] + length).fill_(1);
      batch.response[row].narrow(0, prompt_width - 1, length).fill_(1);
    }
  }
  // Sample 1 of prompt 0 begins its response like sample 0: a prefix longer than the prompt.
  batch.ids[1].narrow(0, prompt_width, 2).copy_(batch.ids[0].narrow(0, prompt_width, 2));
  return batch;
}

TEST_CASE("rows sharing a prompt give the log-probs and gradients of each row computed whole",
          "[train][packing]") {
  const GroupBatch batch = MakeGroupBatch();
  {
    // Shared: each prompt computed once, and row 1's two response tokens with row 0's (all but
    // its last: a row keeps one token of its own).
    const at::Tensor real = batch.attention.ne(0).contiguous();
    const PackedRows plan = PlanPackedRows(batch.ids.data_ptr<int64_t>(), real.data_ptr<bool>(),
                                           nullptr, 9, batch.ids.size(1), /*share=*/true);
    CHECK(static_cast<int64_t>(plan.tokens.size()) == (20 + 18 + 19) + (38 - 1));
    CHECK(plan.starts[2] - plan.starts[1] == 1);
  }
  const auto run = [&](bool packed, bool share, bool scored) {
    model::Transformer net = LoadFloat64Fixture("tiny-qwen2");
    const ScoredPositions positions =
        ForwardMicroBatch(net, batch.ids, batch.attention,
                          {.packed = packed,
                           .scored = scored ? batch.response : at::Tensor(),
                           .share_prefixes = share});
    const at::Tensor log_probs = positions.Unflatten(
        ChunkedLogProbs(positions.hidden, net->HeadWeight(), positions.targets).first);
    // A loss over the responses, weighting each position differently.
    const at::Tensor weights =
        at::linspace(0.5, 1.5, log_probs.numel(), at::kDouble).view(log_probs.sizes());
    (log_probs * batch.response * weights).sum().backward();
    std::vector<at::Tensor> grads;
    for (const auto& p : net->parameters()) grads.push_back(p.grad().clone());
    return std::make_tuple(log_probs.detach() * batch.response, grads,
                           static_cast<int64_t>(positions.targets.size(0)));
  };
  // The reference: padded rows, every position computed and scored.
  const auto [padded, padded_grads, all_positions] = run(false, false, false);
  CHECK(all_positions == 9 * 25);
  const int64_t responses = batch.response.sum().item<int64_t>();
  for (const auto& [name, share, scored] :
       {std::make_tuple("packed", false, false), std::make_tuple("packed, shared", true, false),
        std::make_tuple("packed, shared, responses scored", true, true),
        std::make_tuple("packed, responses scored", false, true)}) {
    INFO(name);
    const auto [log_probs, grads, count] = run(true, share, scored);
    CHECK((log_probs - padded).abs().max().item<double>() <= 1e-10);
    double worst = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      worst = std::max(worst, (grads[i] - padded_grads[i]).abs().max().item<double>());
    }
    INFO("largest gradient difference " << worst);
    CHECK(worst <= 1e-10);
    if (scored) CHECK(count == responses);
  }
  SECTION("padded rows with only the responses scored") {
    const auto [log_probs, grads, count] = run(false, false, true);
    CHECK(count == responses);
    CHECK((log_probs - padded).abs().max().item<double>() <= 1e-10);
    double worst = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      worst = std::max(worst, (grads[i] - padded_grads[i]).abs().max().item<double>());
    }
    CHECK(worst <= 1e-10);
  }
}

TEST_CASE("a micro-batch with nothing scored still runs the model", "[train][packing]") {
  // Replicas keep their collectives in step: a forward whose rows have tokens runs the model
  // (and its backward reaches every parameter) even where no position is scored.
  const GroupBatch batch = MakeGroupBatch();
  model::Transformer net = LoadFloat64Fixture("tiny-qwen2");
  const ScoredPositions positions = ForwardMicroBatch(
      net, batch.ids, batch.attention, {.packed = true, .scored = at::zeros_like(batch.response)});
  CHECK(positions.hidden.size(0) == 0);
  REQUIRE(positions.hidden.requires_grad());
  positions.hidden.sum().backward();
  for (const auto& p : net->named_parameters()) {
    INFO(p.key());
    if (p.key().rfind("lm_head", 0) != 0) CHECK(p.value().grad().defined());  // no head ran
  }
}

TEST_CASE("the update loop shuffles a prompt's samples together", "[train][packing]") {
  // 8 groups of 3 rows; mini-batches of 6 rows, micro-batches of 3, two epochs: every
  // micro-batch is one whole group, the groups' order differs between the epochs, and every row
  // is trained once an epoch.
  model::Transformer net = LoadFloat64Fixture("tiny-qwen2");
  LocalModel trained(net, {});
  UpdateLoopOptions options;
  options.mini_batch = 6;
  options.epochs = 2;
  options.seed = 7;
  options.shuffle_group = 3;
  options.micro.micro_batch = 3;
  std::vector<std::vector<int64_t>> seen;
  const MicroStep step = [&](const MicroBatch& micro, UpdateMetrics&) {
    const at::Tensor rows = micro.rows.cpu().contiguous();
    seen.emplace_back(rows.data_ptr<int64_t>(), rows.data_ptr<int64_t>() + rows.numel());
    at::Tensor loss = at::zeros({}, at::kDouble);
    for (const at::Tensor& p : net->parameters()) loss = loss + p.sum() * 0;
    loss.backward();
    return absl::OkStatus();
  };
  REQUIRE(RunUpdateLoop(trained, at::ones({24, 4}, at::kDouble), at::Tensor(), options, step).ok());
  REQUIRE(seen.size() == 16);
  std::vector<int64_t> first_epoch, second_epoch;
  for (size_t k = 0; k < seen.size(); ++k) {
    REQUIRE(seen[k].size() == 3);
    INFO("micro-batch " << k);
    CHECK(seen[k][0] % 3 == 0);
    CHECK(seen[k][1] == seen[k][0] + 1);
    CHECK(seen[k][2] == seen[k][0] + 2);
    (k < 8 ? first_epoch : second_epoch).push_back(seen[k][0] / 3);
  }
  CHECK(first_epoch != second_epoch);
  for (std::vector<int64_t>* epoch : {&first_epoch, &second_epoch}) {
    std::sort(epoch->begin(), epoch->end());
    CHECK(*epoch == Range(0, 8));
  }

  SECTION("a batch that does not divide into groups is shuffled row by row") {
    seen.clear();
    options.epochs = 1;
    REQUIRE(
        RunUpdateLoop(trained, at::ones({23, 4}, at::kDouble), at::Tensor(), options, step).ok());
    std::vector<int64_t> all;
    bool all_runs = true;  // every micro-batch a run of 3 from a multiple of 3
    for (const auto& rows : seen) {
      all.insert(all.end(), rows.begin(), rows.end());
      all_runs = all_runs && rows.size() == 3 && rows[0] % 3 == 0 && rows[1] == rows[0] + 1 &&
                 rows[2] == rows[0] + 2;
    }
    CHECK_FALSE(all_runs);
    std::sort(all.begin(), all.end());
    CHECK(all == Range(0, 23));
  }
}

}  // namespace
}  // namespace rlhfd::train
