// The no-gradient forwards in micro-batches (worker/roles/forward_passes.h): forwards packed by a
// token budget (verl's log_prob_use_dynamic_bsz; counted in real tokens, as where the forward
// packs rows, so that rows pack out of order here too) give each row what one forward of that
// row alone gives, in row order, whatever the budget; a layout that needs its replicas in step pads
// with forwards of its longest row whose results are dropped; a forward that pads counts the padded
// width. The oracle is the per-row forward (one row per forward), which shares the arithmetic but
// not the batching.
#include "worker/roles/forward_passes.h"

#include <ATen/ATen.h>
#include <torch/types.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "worker/model/model_loader.h"

namespace rlhfd::roles {
namespace {

const std::string kModels = std::string(RLHFD_FIXTURES_DIR) + "/models/";

// A step's layout: prompts left-padded to P, responses right-padded to R, lengths varied.
struct Rows {
  at::Tensor ids, mask;
  int64_t prompt_length = 0;
};

Rows MakeRows(int64_t vocab) {
  const int64_t rows = 11, p = 6, r = 9;
  at::manual_seed(5);
  Rows out{at::randint(1, vocab, {rows, p + r}, at::kLong), at::ones({rows, p + r}, at::kLong), p};
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t prompt = 1 + (i * 3) % p, response = 1 + (i * 5) % r;
    out.mask[i].narrow(0, 0, p - prompt).zero_();
    out.mask[i].narrow(0, p + response, r - response).zero_();
  }
  out.ids.mul_(out.mask);
  return out;
}

// Replicas that agree on more forwards than this rank needs.
class LockstepModel : public train::TrainedModel {
 public:
  explicit LockstepModel(model::Transformer module, int64_t extra)
      : module_(std::move(module)), extra_(extra) {}
  model::Transformer& module() override { return module_; }
  absl::StatusOr<double> FinishStep(double, double) override { return 0.0; }
  void ZeroGrad() override {}
  NamedTensors StateTensors() override { return {}; }
  int replicas() const override { return 2; }
  absl::Status ReduceOverReplicas(std::vector<double>& values, train::ReplicaReduce) override {
    asked = values[0];
    values[0] += static_cast<double>(extra_);
    return absl::OkStatus();
  }
  bool lockstep_forwards() const override { return true; }
  double asked = -1;

 private:
  model::Transformer module_;
  int64_t extra_;
};

double MaxDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

TEST_CASE("forwards packed by tokens give each row its own forward's results, in row order",
          "[roles]") {
  torch::NoGradGuard no_grad;
  auto causal = model::LoadModel(kModels + "tiny-qwen2", {});
  REQUIRE(causal.ok());
  const Rows rows = MakeRows((*causal)->config().vocab_size);
  const ForwardMicroBatches alone{.rows = 1, .setting = "rows"};
  auto expected = ResponseLogProbs(*causal, rows.ids, rows.mask, rows.prompt_length, alone, 0.7);
  REQUIRE(expected.ok());
  // Budgets below the longest row (rows alone), between, and above the whole batch; fixed
  // micro-batches of 4 as the other way.
  for (const ForwardMicroBatches& micro :
       {ForwardMicroBatches{.rows = 4, .setting = "rows"},
        ForwardMicroBatches{.rows = 4, .token_budget = 3, .setting = "tokens"},
        ForwardMicroBatches{.rows = 4, .token_budget = 20, .setting = "tokens"},
        ForwardMicroBatches{.rows = 4, .token_budget = 1000, .setting = "tokens"}}) {
    INFO("rows " << micro.rows << " token budget " << micro.token_budget);
    auto got = ResponseLogProbs(*causal, rows.ids, rows.mask, rows.prompt_length, micro, 0.7);
    REQUIRE(got.ok());
    CHECK(MaxDiff(*got, *expected) < 1e-5);
  }

  auto scorer = model::LoadModel(kModels + "tiny-qwen2-rm", {});
  REQUIRE(scorer.ok());
  auto values_alone = ResponseValues(*scorer, rows.ids, rows.mask, rows.prompt_length, alone);
  auto scores_alone = SequenceScores(*scorer, rows.ids, rows.mask, alone);
  REQUIRE(values_alone.ok());
  REQUIRE(scores_alone.ok());
  const ForwardMicroBatches packed{.rows = 4, .token_budget = 20, .setting = "tokens"};
  auto values = ResponseValues(*scorer, rows.ids, rows.mask, rows.prompt_length, packed);
  auto scores = SequenceScores(*scorer, rows.ids, rows.mask, packed);
  REQUIRE(values.ok());
  REQUIRE(scores.ok());
  CHECK(MaxDiff(*values, *values_alone) < 1e-5);
  CHECK(MaxDiff(*scores, *scores_alone) < 1e-5);
}

TEST_CASE("a layout in lockstep plans the replicas' agreed count, padding with the longest row",
          "[roles]") {
  torch::NoGradGuard no_grad;
  auto causal = model::LoadModel(kModels + "tiny-qwen2", {});
  REQUIRE(causal.ok());
  const Rows rows = MakeRows((*causal)->config().vocab_size);
  const at::Tensor real = rows.mask.sum(1);
  const int64_t longest = real.argmax().item<int64_t>();
  LockstepModel lockstep(*causal, /*extra=*/2);
  const ForwardMicroBatches packed{
      .rows = 4, .token_budget = 20, .setting = "tokens", .lockstep = &lockstep};
  auto plan = PlanForwards(rows.mask, packed);
  REQUIRE(plan.ok());
  CHECK(lockstep.asked == static_cast<double>(plan->real));  // This rank's count was offered.
  REQUIRE(plan->forwards.size() == plan->real + 2);
  for (size_t k = plan->real; k < plan->forwards.size(); ++k) {
    CHECK(plan->forwards[k] == std::vector<int64_t>{longest});
  }
  // Every row is in exactly one counted forward, within the budget unless alone.
  std::vector<int> seen(rows.mask.size(0), 0);
  for (size_t k = 0; k < plan->real; ++k) {
    int64_t tokens = 0;
    for (int64_t row : plan->forwards[k]) {
      ++seen[row];
      tokens += real[row].item<int64_t>();
    }
    CHECK((tokens <= 20 || plan->forwards[k].size() == 1));
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int count) { return count == 1; }));

  // The results: the padding forwards' are dropped.
  const ForwardMicroBatches alone{.rows = 1, .setting = "rows"};
  auto expected = ResponseLogProbs(*causal, rows.ids, rows.mask, rows.prompt_length, alone, 1.0);
  auto got = ResponseLogProbs(*causal, rows.ids, rows.mask, rows.prompt_length, packed, 1.0);
  REQUIRE(expected.ok());
  REQUIRE(got.ok());
  CHECK(got->sizes() == expected->sizes());
  CHECK(MaxDiff(*got, *expected) < 1e-5);

  // Fixed micro-batches agree too: replicas' shares may differ (a validation's).
  lockstep.asked = -1;
  const ForwardMicroBatches fixed{.rows = 4, .setting = "rows", .lockstep = &lockstep};
  auto fixed_plan = PlanForwards(rows.mask, fixed);
  REQUIRE(fixed_plan.ok());
  CHECK(lockstep.asked == 3);               // 11 rows: 4, 4, 3,
  CHECK(fixed_plan->forwards.size() == 5);  // and two padding forwards.
  CHECK(fixed_plan->real == 3);

  // A replica without rows takes part with stand-in forwards and gets an empty result.
  const at::Tensor none_ids = rows.ids.narrow(0, 0, 0), none_mask = rows.mask.narrow(0, 0, 0);
  auto none = PlanForwards(none_mask, fixed);
  REQUIRE(none.ok());
  CHECK(none->real == 0);
  CHECK(none->forwards == std::vector<std::vector<int64_t>>(2, {kStandInRow}));
  for (const ForwardMicroBatches* micro : {&fixed, &packed, &alone}) {
    auto empty = ResponseLogProbs(*causal, none_ids, none_mask, rows.prompt_length, *micro, 1.0);
    INFO(micro->setting);
    REQUIRE(empty.ok());
    REQUIRE(empty->defined());
    CHECK(empty->sizes() == std::vector<int64_t>{0, rows.ids.size(1) - rows.prompt_length});
  }
}

TEST_CASE("a forward that pads its rows counts their padded width against the budget", "[roles]") {
  const Rows rows = MakeRows(100);
  const int64_t width = rows.mask.size(1);  // 15
  ForwardMicroBatches budget{.rows = 4, .token_budget = 3 * width, .setting = "tokens"};
  budget.padded = true;
  auto padded = PlanForwards(rows.mask, budget);
  REQUIRE(padded.ok());
  for (const auto& forward : padded->forwards) CHECK(forward.size() <= 3);
  CHECK(padded->forwards.size() == 4);  // 11 rows, 3 to a forward.
  budget.padded = false;
  auto packed = PlanForwards(rows.mask, budget);
  REQUIRE(packed.ok());
  CHECK(packed->forwards.size() < padded->forwards.size());  // Real tokens fit more rows.
}

TEST_CASE("a forward of no rows is refused, naming the setting", "[roles]") {
  const Rows rows = MakeRows(100);
  auto refused = PlanForwards(rows.mask, {.rows = 0, .setting = "roles.x.log_prob_micro"});
  REQUIRE_FALSE(refused.ok());
  CHECK(std::string(refused.status().message()).find("roles.x.log_prob_micro") !=
        std::string::npos);
}

}  // namespace
}  // namespace rlhfd::roles
