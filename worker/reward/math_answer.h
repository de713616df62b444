// verl's MATH reward (verl 0.9.1's verl/utils/reward_score/math_reward.py, from lm-evaluation-harness's
// hendrycks_math): the last \boxed{...} (or "\boxed " up to the next '$') of the response,
// compared with the ground truth after the same string normalisation. Where verl's code raises
// (an assertion, an index past a string's end), the same outcome follows: a normalisation that
// raises makes the comparison exact, an extraction that raises scores 0.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace rlhfd::reward {

// last_boxed_only_string: the last "\boxed{...}" / "\fbox{...}" with balanced braces, or the
// text after the last "\boxed " up to a '$'; nullopt when there is none.
std::optional<std::string> LastBoxedOnlyString(std::string_view text);

// remove_boxed: the inside of "\boxed{...}" or what follows "\boxed "; nullopt where verl's
// asserts fail (an \fbox, say).
std::optional<std::string> RemoveBoxed(std::string_view boxed);

// strip_string; nullopt where verl's raises.
std::optional<std::string> StripMathString(std::string_view text);

// is_equiv: normalised texts equal (exact comparison when normalising raises).
bool MathEquivalent(std::string_view answer, std::string_view ground_truth);

// 1 when the response's last boxed answer is equivalent to the ground truth, else 0.
double MathScore(std::string_view response, std::string_view ground_truth);

}  // namespace rlhfd::reward
