// verl's Search-R1 exact-match reward (verl 0.9.1's
// verl/utils/reward_score/search_r1_like_qa_em.py, compute_score as default_compute_score calls
// it): the last <answer>...</answer> of the response, stripped, equals one of the ground truth's
// targets after SQuAD's normalize_answer (lower case, no ASCII punctuation, no articles, single
// spaces): 1, or 0.25 when the response holds more than 10 "<answer>" or "</answer>" tags; 0
// otherwise.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rlhfd::reward {

// extract_solution: the stripped inside of the last <answer>...</answer>, or nullopt.
std::optional<std::string_view> ExtractTaggedAnswer(std::string_view response);

// normalize_answer.
std::string NormalizeQaAnswer(std::string_view answer);

double SearchR1QaScore(std::string_view response, const std::vector<std::string>& targets);

}  // namespace rlhfd::reward
