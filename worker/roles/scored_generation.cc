#include "worker/roles/scored_generation.h"

#include <string>
#include <utility>

#include "common/stages/response_samples.h"
#include "common/status/status_macros.h"
#include "worker/roles/rollout_sampling.h"

namespace rlhfd::roles {
namespace {

// Generates for `prompts` with `sampling` (seeded per prompt from `seed`) and scores them; the
// responses among the first `log_samples` of all prompts' (this rank's prompts start at
// `first_prompt`) also as samples, and with roles.reward.val_rules when `val_rules`.
absl::StatusOr<v1::ValidateReply> GenerateAndScore(
    ActorRole& actor, const google::protobuf::RepeatedPtrField<v1::PromptRow>& prompts,
    int64_t first_prompt, uint64_t seed, const rollout::SamplingParams& sampling,
    const ResponseScorer& scorer, const std::atomic<bool>* cancelled, int64_t log_samples,
    bool val_rules) {
  const model::Tokenizer& tokenizer = actor.tokenizer();
  ASSIGN_OR_RETURN(const PromptRequests encoded,
                   EncodeRequests(tokenizer, prompts, actor.spec().data(), first_prompt, seed,
                                  sampling, actor.prompt_tools()));
  const std::vector<rollout::GenerationRequest>& requests = encoded.requests;
  v1::ValidateReply reply;
  ASSIGN_OR_RETURN(std::vector<rollout::GenerationResult> results,
                   actor.Rollout(requests, /*step=*/0,  // 0: not a step's rollout
                                 *reply.mutable_metrics()));
  actor.ReleaseRollout();
  std::vector<ScoredResponse> scored;
  std::vector<int64_t> rows;  // each response's index among all prompts' responses
  for (int64_t i = 0; i < prompts.size(); ++i) {
    const int64_t per_prompt = static_cast<int64_t>(results[i].samples.size());
    for (int64_t j = 0; j < per_prompt; ++j) {
      const rollout::Completion& sample = results[i].samples[j];
      rows.push_back((first_prompt + i) * per_prompt + j);
      const std::vector<int32_t> ids(sample.token_ids.begin(), sample.token_ids.end());
      std::string text = tokenizer.Decode(ids, /*skip_special_tokens=*/true);
      v1::RowInfo* info = reply.add_rows();
      info->set_prompt_tokens(static_cast<int32_t>(requests[i].prompt_ids.size()));
      info->set_response_tokens(static_cast<int32_t>(ids.size()));
      info->set_truncated(sample.finish_reason == rollout::FinishReason::kLength);
      reply.add_responses(text);
      scored.push_back({encoded.texts[i], std::move(text), prompts[i].ground_truth_json(),
                        prompts[i].data_source(), prompts[i].extra_info_json()});
    }
  }
  // Errors name the first response's row among all prompts' responses, as `rows` numbers them.
  ASSIGN_OR_RETURN(const std::vector<double> scores,
                   scorer.Score(scored, rows.empty() ? 0 : rows.front(), cancelled));
  for (double score : scores) reply.add_scores(score);
  if (val_rules) {
    ASSIGN_OR_RETURN(const auto rule_scores,
                     scorer.ScoreWithValRules(scored, rows.empty() ? 0 : rows.front()));
    for (const auto& [rule, values] : rule_scores) {
      v1::RuleScores* out = reply.add_rule_scores();
      out->set_rule(rule);
      out->mutable_scores()->Add(values.begin(), values.end());
    }
  }
  for (size_t i = 0; i < scored.size() && rows[i] < log_samples; ++i) {
    *reply.add_samples() = stages::MakeResponseSample(rows[i], scored[i].prompt_text,
                                                      scored[i].response_text, scores[i],
                                                      /*validation=*/true);
  }
  return reply;
}

}  // namespace

absl::StatusOr<v1::ValidateReply> ValidateActor(ActorRole& actor,
                                                const v1::ValidateRequest& request,
                                                const ResponseScorer& scorer,
                                                const std::atomic<bool>* cancelled) {
  return GenerateAndScore(actor, request.prompts(), request.first_prompt(), request.seed(),
                          ValidationSampling(actor.spec()), scorer, cancelled,
                          actor.spec().trainer().log_samples(), /*val_rules=*/true);
}

absl::StatusOr<std::vector<double>> GreedyBaseline(ActorRole& actor,
                                                   const v1::GenerateRequest& request,
                                                   const ResponseScorer& scorer,
                                                   const std::atomic<bool>* cancelled) {
  rollout::SamplingParams greedy = TrainingSampling(actor.spec());
  greedy.n = 1;
  greedy.temperature = 0;
  greedy.top_k = 0;
  greedy.top_p = 1.0;
  ASSIGN_OR_RETURN(const v1::ValidateReply scored,
                   GenerateAndScore(actor, request.prompts(), request.first_prompt(),
                                    request.seed(), greedy, scorer, cancelled,
                                    /*log_samples=*/0, /*val_rules=*/false));
  return std::vector<double>(scored.scores().begin(), scored.scores().end());
}

}  // namespace rlhfd::roles
