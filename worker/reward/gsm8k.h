// verl's gsm8k reward (verl/utils/reward_score/gsm8k.py), character for character: the answer is
// read from the response's last 300 characters, either after the last "#### " (strict: verl's
// default, and what rlhfd's "gsm8k" rule uses) or as the last number (flexible: the
// "gsm8k_flexible" rule), and compared with the ground truth as text. Plus a format verl lacks,
// for prompts that ask for a boxed answer ("gsm8k_boxed"): the last \boxed{...} of the whole
// response as the math rule finds it (verl's last_boxed_only_string), commas and surrounding
// whitespace removed, compared as text in the same way ("\boxed{1,234}" scores for "1234";
// "\boxed{72.0}", "\boxed{\$72}" and "\boxed{72 apples}" do not for "72", as "#### 72.0" does not).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace rlhfd::reward {

enum class Gsm8kMethod { kStrict, kFlexible, kBoxed };

// The answer verl's extract_solution finds, or nullopt when it finds none. Strict strips ',' and
// '$'; flexible returns the last match of -?[0-9.,]+ that is not "" or "." as it stands; boxed
// returns the last box's inside without ',' and surrounding whitespace.
std::optional<std::string> ExtractGsm8kAnswer(std::string_view response,
                                              Gsm8kMethod method = Gsm8kMethod::kStrict);

// `score` when the answer equals `ground_truth`, `format_score` when another answer was found,
// 0 when none was.
double Gsm8kScore(std::string_view response, std::string_view ground_truth,
                  Gsm8kMethod method = Gsm8kMethod::kStrict, double format_score = 0.0,
                  double score = 1.0);

}  // namespace rlhfd::reward
