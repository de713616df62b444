#include "worker/roles/response_scorer.h"

#include "absl/strings/str_cat.h"
#include "common/status/status_macros.h"
#include "common/util/text.h"
#include "google/protobuf/util/json_util.h"

namespace rlhfd::roles {
namespace {

// Each response's `field` (ground_truth_json or extra_info_json, named `name` in errors) parsed
// as JSON; null where the row has none.
absl::StatusOr<std::vector<nlohmann::json>> JsonPerResponse(
    const std::vector<ScoredResponse>& responses, std::string ScoredResponse::*field,
    const char* name, int64_t first_row) {
  std::vector<nlohmann::json> values;
  for (size_t i = 0; i < responses.size(); ++i) {
    const std::string& text = responses[i].*field;
    nlohmann::json value =
        text.empty() ? nlohmann::json() : nlohmann::json::parse(text, nullptr, false);
    if (value.is_discarded()) {
      return absl::InvalidArgumentError(absl::StrCat("row ", first_row + static_cast<int64_t>(i),
                                                     ": ", name, " is not JSON: ",
                                                     SanitizeForDisplay(text, 80)));
    }
    values.push_back(std::move(value));
  }
  return values;
}

absl::StatusOr<std::vector<nlohmann::json>> GroundTruths(
    const std::vector<ScoredResponse>& responses, int64_t first_row) {
  return JsonPerResponse(responses, &ScoredResponse::ground_truth_json, "ground_truth_json",
                         first_row);
}

absl::StatusOr<std::vector<double>> ScoreWithRule(const reward::RuleReward& rule,
                                                  const std::vector<ScoredResponse>& responses,
                                                  const std::vector<nlohmann::json>& truths,
                                                  int64_t first_row) {
  std::vector<double> scores;
  for (size_t i = 0; i < responses.size(); ++i) {
    absl::StatusOr<double> score =
        rule.Score(responses[i].response_text, truths[i], responses[i].data_source);
    if (!score.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("row ", first_row + static_cast<int64_t>(i),
                                                     ": ", score.status().message()));
    }
    scores.push_back(*score);
  }
  return scores;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ResponseScorer>> ResponseScorer::Create(
    const v1::RewardSpec& spec) {
  auto scorer = std::unique_ptr<ResponseScorer>(new ResponseScorer());
  for (const std::string& name : spec.val_rules()) {
    ASSIGN_OR_RETURN(reward::RuleReward rule, reward::RuleReward::Make(name));
    scorer->val_rules_.push_back(std::move(rule));
  }
  if (!spec.rule().empty()) {
    absl::StatusOr<reward::RuleReward> rule = reward::RuleReward::Make(spec.rule());
    if (!rule.ok()) return rule.status();
    scorer->rule_ = *std::move(rule);
  } else if (!spec.custom_reward_function().path().empty()) {
    const v1::PythonRewardSpec& function = spec.custom_reward_function();
    std::string kwargs;
    if (!google::protobuf::util::MessageToJsonString(function.reward_kwargs(), &kwargs).ok()) {
      return absl::InvalidArgumentError(
          "roles.reward.custom_reward_function.reward_kwargs cannot be written as JSON");
    }
    reward::PythonRewardOptions options{
        .path = function.path(),
        .reward_kwargs = nlohmann::json::parse(kwargs, nullptr, /*allow_exceptions=*/false),
        .processes = function.processes(),
        .timeout = absl::Seconds(function.timeout_s()),
        .memory_limit_mb = function.memory_limit_mb()};
    if (!function.name().empty()) options.name = function.name();
    ASSIGN_OR_RETURN(scorer->python_, reward::PythonReward::Create(std::move(options)));
  } else if (!spec.remote().empty()) {
    scorer->remote_ = std::make_unique<reward::RemoteReward>(reward::RemoteRewardOptions{
        .url = spec.remote(), .timeout = absl::Seconds(spec.remote_timeout_s())});
  } else {
    return nullptr;
  }
  return scorer;
}

absl::StatusOr<std::vector<double>> ResponseScorer::Score(
    const std::vector<ScoredResponse>& responses, int64_t first_row,
    const std::atomic<bool>* cancelled) const {
  ASSIGN_OR_RETURN(std::vector<nlohmann::json> truths, GroundTruths(responses, first_row));
  if (python_ || remote_) {
    ASSIGN_OR_RETURN(std::vector<nlohmann::json> extra_infos,
                     JsonPerResponse(responses, &ScoredResponse::extra_info_json,
                                     "extra_info_json", first_row));
    if (python_) {
      std::vector<reward::PythonRewardCall> calls;
      for (size_t i = 0; i < responses.size(); ++i) {
        calls.push_back({.data_source = responses[i].data_source,
                         .solution_str = responses[i].response_text,
                         .ground_truth = std::move(truths[i]),
                         .extra_info = std::move(extra_infos[i])});
      }
      return python_->Score(calls, first_row, cancelled);
    }
    reward::RemoteRewardRequest request;
    for (size_t i = 0; i < responses.size(); ++i) {
      request.queries.push_back(responses[i].prompt_text + responses[i].response_text);
      request.prompts.push_back(responses[i].prompt_text);
      request.labels.push_back(truths[i]);
      request.responses.push_back(responses[i].response_text);
      request.data_sources.push_back(responses[i].data_source);
      request.extra_infos.push_back(std::move(extra_infos[i]));
    }
    return remote_->Score(request, cancelled);
  }
  return ScoreWithRule(*rule_, responses, truths, first_row);
}

absl::StatusOr<std::vector<std::pair<std::string, std::vector<double>>>>
ResponseScorer::ScoreWithValRules(const std::vector<ScoredResponse>& responses,
                                  int64_t first_row) const {
  std::vector<std::pair<std::string, std::vector<double>>> scored;
  if (val_rules_.empty()) return scored;
  ASSIGN_OR_RETURN(const std::vector<nlohmann::json> truths, GroundTruths(responses, first_row));
  for (const reward::RuleReward& rule : val_rules_) {
    ASSIGN_OR_RETURN(std::vector<double> scores, ScoreWithRule(rule, responses, truths, first_row));
    scored.emplace_back(rule.rule(), std::move(scores));
  }
  return scored;
}

}  // namespace rlhfd::roles
