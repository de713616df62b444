// ResponseScorer's roles.reward.val_rules: each named rule scores every validation response beside
// the reward, against scores written out by hand from the rules' definitions (docs/rewards.md),
// so that a strict-format reward can be told apart from a correct answer in another format.
#include "worker/roles/response_scorer.h"

#include <catch2/catch.hpp>

namespace rlhfd::roles {
namespace {

ScoredResponse Response(std::string text, std::string ground_truth_json) {
  return {.prompt_text = "Q",
          .response_text = std::move(text),
          .ground_truth_json = std::move(ground_truth_json),
          .data_source = "openai/gsm8k",
          .extra_info_json = ""};
}

TEST_CASE("val_rules score each response with every named rule beside the reward", "[roles]") {
  v1::RewardSpec spec;
  spec.set_rule("gsm8k");
  spec.add_val_rules("gsm8k_flexible");
  spec.add_val_rules("gsm8k_boxed");
  absl::StatusOr<std::unique_ptr<ResponseScorer>> scorer = ResponseScorer::Create(spec);
  REQUIRE(scorer.ok());
  const std::vector<ScoredResponse> responses = {
      Response("She pays 3 * 24 = 72 dollars.\n#### 72", "\"72\""),  // every format
      Response("So the answer is \\boxed{72}.", "\"72\""),           // boxed: last number too
      Response("The total is 1,000 and then 72 more: 1072", "72"),   // last number wrong
      Response("#### 71 so \\boxed{72}", "\"72\""),                  // strict wrong, boxed right
  };
  absl::StatusOr<std::vector<double>> reward = (*scorer)->Score(responses, 0, nullptr);
  REQUIRE(reward.ok());
  CHECK(*reward == std::vector<double>{1, 0, 0, 0});
  const auto rule_scores = (*scorer)->ScoreWithValRules(responses, 0);
  REQUIRE(rule_scores.ok());
  REQUIRE(rule_scores->size() == 2);
  CHECK((*rule_scores)[0].first == "gsm8k_flexible");
  CHECK((*rule_scores)[0].second == std::vector<double>{1, 1, 0, 1});
  CHECK((*rule_scores)[1].first == "gsm8k_boxed");
  CHECK((*rule_scores)[1].second == std::vector<double>{0, 1, 0, 1});

  // No val_rules: nothing beside the reward.
  spec.clear_val_rules();
  const auto plain = ResponseScorer::Create(spec);
  REQUIRE(plain.ok());
  const auto none = (*plain)->ScoreWithValRules(responses, 0);
  REQUIRE(none.ok());
  CHECK(none->empty());
}

TEST_CASE("a val_rules entry that is no rule and a ground truth that is no JSON are named",
          "[roles]") {
  v1::RewardSpec spec;
  spec.set_rule("gsm8k");
  spec.add_val_rules("vibes");
  const auto unknown = ResponseScorer::Create(spec);
  REQUIRE_FALSE(unknown.ok());
  CHECK_THAT(std::string(unknown.status().message()), Catch::Contains("vibes"));

  spec.clear_val_rules();
  spec.add_val_rules("gsm8k_flexible");
  const auto scorer = ResponseScorer::Create(spec);
  REQUIRE(scorer.ok());
  const auto bad = (*scorer)->ScoreWithValRules(
      {Response("#### 1", "\"1\""), Response("#### 2", "{not json")}, 40);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.status().message()),
             Catch::Contains("row 41: ground_truth_json is not JSON"));
}

}  // namespace
}  // namespace rlhfd::roles
