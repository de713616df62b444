// Rule rewards, hand-worked case by case against verl's reward_score code read line by line
// (gsm8k.py, math_reward.py, math_dapo.py, search_r1_like_qa_em.py, countdown.py), including where
// its Python raises, clips by characters or keeps a loop variable; the registry against the
// config's table of names.
#include "common/config/reward_rules.h"

#include <catch2/catch.hpp>
#include <string>

#include "nlohmann/json.hpp"
#include "worker/reward/countdown.h"
#include "worker/reward/expression.h"
#include "worker/reward/gsm8k.h"
#include "worker/reward/math_answer.h"
#include "worker/reward/math_dapo.h"
#include "worker/reward/rule_reward.h"
#include "worker/reward/search_r1_qa.h"
#include "worker/reward/simple_rules.h"

namespace rlhfd::reward {
namespace {

using nlohmann::json;

std::string Repeat(const std::string& piece, int times) {
  std::string out;
  for (int i = 0; i < times; ++i) out += piece;
  return out;
}

TEST_CASE("gsm8k: verl's strict extraction", "[reward]") {
  // An answer of openai/gsm8k as verl's examples/data_preprocess/gsm8k.py reads it.
  const std::string solution =
      "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
      "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72";
  CHECK(ExtractGsm8kAnswer(solution) == "72");
  CHECK(Gsm8kScore(solution, "72") == 1.0);
  CHECK(Gsm8kScore(solution, "73") == 0.0);  // format_score 0

  CHECK(ExtractGsm8kAnswer("#### 1,234") == "1234");  // ',' stripped
  CHECK(ExtractGsm8kAnswer("#### -3") == "-3");
  CHECK(ExtractGsm8kAnswer("#### 72.") == "72.");  // then "72." != "72"
  CHECK(Gsm8kScore("#### 72.", "72") == 0.0);
  CHECK(ExtractGsm8kAnswer("first #### 5, then #### 7") == "7");  // the last one
  CHECK(ExtractGsm8kAnswer("####72") == std::nullopt);            // the space is required
  CHECK(ExtractGsm8kAnswer("#### -x #### 9") == "9");
  CHECK(ExtractGsm8kAnswer("no answer here") == std::nullopt);
  CHECK(Gsm8kScore("no answer here", "72") == 0.0);
}

TEST_CASE("gsm8k: only the last 300 characters are read, counted as characters", "[reward]") {
  // "#### 72" is 7 characters: with 293 after it, it is inside the last 300; with 294, cut.
  CHECK(ExtractGsm8kAnswer("#### 72" + Repeat(" ", 293)) == "72");
  CHECK(ExtractGsm8kAnswer("#### 72" + Repeat(" ", 294)) == std::nullopt);
  // Two-byte characters: 293 of them are 586 bytes but still 293 characters.
  CHECK(ExtractGsm8kAnswer("#### 72" + Repeat("\xC3\xA9", 293)) == "72");
  CHECK(ExtractGsm8kAnswer("#### 72" + Repeat("\xC3\xA9", 294)) == std::nullopt);
}

TEST_CASE("gsm8k: flexible extraction takes the last number that is not '.'", "[reward]") {
  CHECK(ExtractGsm8kAnswer("3 apples and 4.5 oranges.", Gsm8kMethod::kFlexible) == "4.5");
  CHECK(ExtractGsm8kAnswer("1,000 dollars", Gsm8kMethod::kFlexible) == "1,000");  // kept
  CHECK(ExtractGsm8kAnswer("so -12", Gsm8kMethod::kFlexible) == "-12");
  // Only "." matches: Python's loop variable ends on the first of them.
  CHECK(ExtractGsm8kAnswer(". a .", Gsm8kMethod::kFlexible) == ".");
  CHECK(ExtractGsm8kAnswer("none", Gsm8kMethod::kFlexible) == std::nullopt);
}

TEST_CASE("gsm8k_boxed: the last box's inside, commas and surrounding spaces removed", "[reward]") {
  // rlhfd's own format (verl has none), hand-worked from its definition in gsm8k.h.
  CHECK(ExtractGsm8kAnswer("so \\boxed{72}.", Gsm8kMethod::kBoxed) == "72");
  CHECK(ExtractGsm8kAnswer("\\boxed{1} then \\boxed{ 1,234 }", Gsm8kMethod::kBoxed) == "1234");
  CHECK(ExtractGsm8kAnswer("\\boxed{-5}", Gsm8kMethod::kBoxed) == "-5");
  CHECK(ExtractGsm8kAnswer("\\boxed{\\frac{1}{2}}", Gsm8kMethod::kBoxed) == "\\frac{1}{2}");
  CHECK(ExtractGsm8kAnswer("#### 72", Gsm8kMethod::kBoxed) == std::nullopt);
  CHECK(ExtractGsm8kAnswer("\\boxed{72", Gsm8kMethod::kBoxed) == std::nullopt);  // unclosed
  CHECK(ExtractGsm8kAnswer("\\fbox{72}", Gsm8kMethod::kBoxed) == std::nullopt);

  CHECK(Gsm8kScore("The total is \\boxed{72}.", "72", Gsm8kMethod::kBoxed) == 1.0);
  CHECK(Gsm8kScore("\\boxed{1,234}", "1234", Gsm8kMethod::kBoxed) == 1.0);
  CHECK(Gsm8kScore("\\boxed{72} wait, \\boxed{73}", "72", Gsm8kMethod::kBoxed) == 0.0);
  // Compared as text, as strict compares "#### N": no numeric equivalence, no units.
  CHECK(Gsm8kScore("\\boxed{72.0}", "72", Gsm8kMethod::kBoxed) == 0.0);
  CHECK(Gsm8kScore("\\boxed{\\$72}", "72", Gsm8kMethod::kBoxed) == 0.0);
  CHECK(Gsm8kScore("\\boxed{72 apples}", "72", Gsm8kMethod::kBoxed) == 0.0);
  // Strict and boxed read different markers.
  CHECK(Gsm8kScore("#### 72", "72", Gsm8kMethod::kBoxed) == 0.0);
  CHECK(Gsm8kScore("\\boxed{72}", "72") == 0.0);
  // Not clipped to 300 characters, as the math rule reads boxes.
  CHECK(Gsm8kScore("\\boxed{72}" + Repeat(" ", 400), "72", Gsm8kMethod::kBoxed) == 1.0);
  CHECK(Gsm8kScore("#### 72" + Repeat(" ", 400), "72") == 0.0);
}

TEST_CASE("math: the last boxed answer", "[reward]") {
  CHECK(LastBoxedOnlyString("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\boxed{\\frac{1}{2}}");
  CHECK(LastBoxedOnlyString("\\boxed{a}{b}") == "\\boxed{a}");
  CHECK(LastBoxedOnlyString("so \\boxed 5$ done") == "\\boxed 5");
  CHECK(LastBoxedOnlyString("\\fbox{7}") == "\\fbox{7}");
  CHECK(LastBoxedOnlyString("\\boxed{unclosed") == std::nullopt);
  CHECK(LastBoxedOnlyString("nothing") == std::nullopt);
  CHECK(RemoveBoxed("\\boxed{42}") == "42");
  CHECK(RemoveBoxed("\\boxed{}") == "");
  CHECK(RemoveBoxed("\\boxed 5") == "5");
  CHECK(RemoveBoxed("\\fbox{7}") == std::nullopt);  // verl's assert: an \fbox never scores
}

TEST_CASE("math: verl's normalisation, hand-worked", "[reward]") {
  CHECK(StripMathString("\\frac12") == "\\frac{1}{2}");
  CHECK(StripMathString("\\dfrac{3}{4}") == "\\frac{3}{4}");
  CHECK(StripMathString("0.5") == "\\frac{1}{2}");
  CHECK(StripMathString("1/2") == "\\frac{1}{2}");
  CHECK(StripMathString("-1/2") == "\\frac{-1}{2}");
  CHECK(StripMathString("01/2") == "01/2");  // int("01") prints as 1: no rewrite
  CHECK(StripMathString("x = 5") == "5");
  CHECK(StripMathString("abc = 5") == "abc=5");  // left side longer than 2
  CHECK(StripMathString("90^\\circ") == "90");
  CHECK(StripMathString("10\\%") == "10");
  // a\\\% -> (\\ to \) a\\% -> verl 0.9.1 removes "\\%" before "\%": a, not a\.
  CHECK(StripMathString("a\\\\\\%") == "a");
  CHECK(StripMathString("\\left( 1,2 \\right)") == "(1,2)");
  CHECK(StripMathString("5\\text{ cm}") == "5");
  CHECK(StripMathString(".5") == "\\frac{1}{2}");
  CHECK(StripMathString("\\sqrt3") == "\\sqrt{3}");
  CHECK(StripMathString("\\frac{\\sqrt3}{2}") == "\\frac{\\sqrt{3}}{2}");
  CHECK(StripMathString("\\frac1{72}") == "\\frac{1}{72}");
  // A two-byte character is one character of Python's str.
  CHECK(StripMathString("\\frac\xC3\xA9"
                        "b") == "\\frac{\xC3\xA9}{b}");
  // Where verl raises: \text{ twice (assert), a trailing \frac or \sqrt (index past the end).
  CHECK(StripMathString("1\\text{ a}\\text{ b}") == std::nullopt);
  CHECK(StripMathString("\\frac") == std::nullopt);
  CHECK(StripMathString("2\\sqrt") == std::nullopt);
}

TEST_CASE("math: scores", "[reward]") {
  CHECK(MathScore("so the answer is \\boxed{\\frac{1}{2}}.", "\\frac12") == 1.0);
  CHECK(MathScore("\\boxed{0.5}", "\\frac{1}{2}") == 1.0);
  CHECK(MathScore("\\boxed{1/2}", "\\frac{1}{2}") == 1.0);
  CHECK(MathScore("\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}") == 1.0);
  CHECK(MathScore("\\boxed{x = 5}", "5") == 1.0);
  CHECK(MathScore("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}") == 1.0);
  CHECK(MathScore("\\boxed 5$", "5") == 1.0);
  CHECK(MathScore("\\boxed{6}", "5") == 0.0);
  CHECK(MathScore("\\fbox{5}", "5") == 0.0);
  CHECK(MathScore("5", "5") == 0.0);  // no box
  // Normalising raises for both: is_equiv falls back to comparing the raw strings.
  CHECK(MathScore("\\boxed{\\frac}", "\\frac") == 1.0);
  CHECK(MathScore("\\boxed{\\frac}", "\\frac ") == 0.0);
}

TEST_CASE("math_dapo: the last Minerva answer line, as Python's regex finds it", "[reward]") {
  CHECK(LastMinervaAnswer("The answer is 3.\nAnswer: $\\frac{1}{2}$\n") == "$\\frac{1}{2}$");
  CHECK(LastMinervaAnswer("ANSWER :\n 7") == "7");     // \s* crosses the newline
  CHECK(LastMinervaAnswer("Answer: \t\n\n") == "\t");  // \s* gives back what [^\n]+ needs
  CHECK(LastMinervaAnswer("An\u017fwer: 5") == "5");   // IGNORECASE folds LONG S onto 's'
  CHECK(LastMinervaAnswer("Answer: 1 answer: 2\nanswer:3") == "3");
  CHECK(LastMinervaAnswer("Answer:\n\n") == std::nullopt);
  CHECK(LastMinervaAnswer("no marker") == std::nullopt);
}

TEST_CASE("math_dapo: normalize_final_answer, hand-worked", "[reward]") {
  CHECK(NormalizeDapoAnswer("x = 1,000") == "1000");
  CHECK(NormalizeDapoAnswer("\\frac12") == "\\frac{1}{2}");
  CHECK(NormalizeDapoAnswer("\\sqrt2") == "\\sqrt{2}");
  CHECK(NormalizeDapoAnswer("$5$ cm") == "5");
  CHECK(NormalizeDapoAnswer("\\text{(A)}") == "(A)");
  CHECK(NormalizeDapoAnswer("10^\\circ") == "10");
  CHECK(NormalizeDapoAnswer("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}");
}

TEST_CASE("math_dapo: scores 1 or -1, Minerva first, then the box as written", "[reward]") {
  CHECK(MathDapoScore("Answer: 5 dollars", "5") == 1.0);
  CHECK(MathDapoScore("Answer: 6", "5") == -1.0);
  CHECK(MathDapoScore("\\boxed{5}", "5") == 1.0);
  CHECK(MathDapoScore("so \\boxed{ 5}", "5") == -1.0);         // the box is not normalised
  CHECK(MathDapoScore("Answer: 4\n\\boxed{5}", "5") == -1.0);  // Minerva's answer decides
  // Only the last 300 characters are read; with no answer at all, the normalised ground truth
  // is compared with "[INVALID]".
  CHECK(MathDapoScore("Answer: 5\n" + Repeat("\u00e9", 300), "5") == -1.0);
  CHECK(MathDapoScore("Answer: 5\n" + Repeat("\u00e9", 300), "[INVALID]") == 1.0);
  // The box is looked for in the last 100 characters.
  CHECK(MathDapoScore("\\boxed{5}" + Repeat(" ", 91), "5") == 1.0);
  CHECK(MathDapoScore("\\boxed{5}" + Repeat(" ", 92), "5") == -1.0);
}

TEST_CASE("search_r1_qa_em: the last tagged answer against SQuAD-normalised targets", "[reward]") {
  CHECK(ExtractTaggedAnswer("<answer> a </answer> then <answer>\n Paris \n</answer>") == "Paris");
  CHECK(ExtractTaggedAnswer("<answer>Paris") == std::nullopt);
  CHECK(NormalizeQaAnswer("The Beatles!") == "beatles");
  CHECK(NormalizeQaAnswer("  A  Tale of\tTwo Cities. ") == "tale of two cities");
  CHECK(NormalizeQaAnswer("anthem") == "anthem");
  CHECK(NormalizeQaAnswer("\u00c9COLE") == "\u00e9cole");  // str.lower beyond ASCII
  CHECK(NormalizeQaAnswer("\u0130") == "i\u0307");         // and into two characters
  CHECK(NormalizeQaAnswer("a_b") == "ab");                 // '_' is punctuation
  CHECK(NormalizeQaAnswer("\u00e9 a") == "\u00e9");        // \b after a non-ASCII letter

  CHECK(SearchR1QaScore("<answer>The Beatles</answer>", {"beatles", "x"}) == 1.0);
  CHECK(SearchR1QaScore(Repeat("<answer>beatles</answer>", 10), {"Beatles"}) == 1.0);
  CHECK(SearchR1QaScore(Repeat("<answer>beatles</answer>", 11), {"Beatles"}) == 0.25);
  CHECK(SearchR1QaScore("<answer>stones</answer>", {"beatles"}) == 0.0);
  CHECK(SearchR1QaScore("beatles", {"beatles"}) == 0.0);
  CHECK(SearchR1QaScore("<answer>beatles</answer>", {}) == 0.0);
}

TEST_CASE("countdown: equations as verl scores them", "[reward]") {
  const std::vector<int64_t> numbers = {6, 4, 3, 1};
  CHECK(CountdownScore("Let me think.\n<answer>6 / (1 - 3 / 4)</answer>", 24, numbers) == 1.0);
  CHECK(CountdownScore("<answer>6 + 1 + 3 + 4</answer>", 24, numbers) == 0.1);    // 14
  CHECK(CountdownScore("<answer>6 * 4</answer>", 24, numbers) == 0.1);            // 3, 1 unused
  CHECK(CountdownScore("<answer>6 * 4 * 1 * 1</answer>", 24, numbers) == 0.1);    // 1 twice
  CHECK(CountdownScore("<answer>6 / (4 - 3 - 1)</answer>", 24, numbers) == 0.1);  // / 0
  CHECK(CountdownScore("<answer>(6 - 4 + 1) ** 3</answer>", 27, {6, 4, 1, 3}) == 1.0);
  CHECK(CountdownScore("<answer>6*4 if 3 else 1</answer>", 24, numbers) == 0.1);  // not allowed
  CHECK(CountdownScore("<answer>6 / (1 - 3 / 4)</answer>\nDone.", 24, numbers) == 0.0);
  CHECK(CountdownScore("no answer", 24, numbers) == 0.0);
  CHECK(CountdownScore("Assistant: <answer>44 + 19 + 35</answer>", 98, {44, 19, 35}) == 1.0);
  CHECK(ExtractCountdownEquation("<answer> 1+2 </answer> <answer>3</answer>") == "3");
  CHECK(ExtractCountdownEquation("<answer>a<answer>b</answer>") == "a<answer>b");
}

TEST_CASE("countdown: the evaluator follows Python's arithmetic", "[reward]") {
  CHECK(EvaluateArithmetic("2**3**2") == 512.0);  // right-associative
  CHECK(EvaluateArithmetic("-2**2") == -4.0);     // ** binds tighter than unary minus
  CHECK(EvaluateArithmetic("2**-1") == 0.5);
  CHECK(EvaluateArithmetic("7//2") == 3.0);
  CHECK(EvaluateArithmetic("-7//2") == -4.0);
  CHECK(EvaluateArithmetic("1//0.1") == 9.0);  // Python's, not floor(1 / 0.1)
  CHECK(EvaluateArithmetic("2*(3+4)-5/2") == 11.5);
  CHECK(EvaluateArithmetic(" 3 ") == 3.0);
  CHECK(EvaluateArithmetic("1.") == 1.0);
  CHECK(EvaluateArithmetic(".5") == 0.5);
  CHECK(EvaluateArithmetic("00") == 0.0);
  CHECK(EvaluateArithmetic("05.5") == 5.5);
  CHECK(EvaluateArithmetic("05") == std::nullopt);  // leading zero
  CHECK(EvaluateArithmetic("1/0") == std::nullopt);
  CHECK(EvaluateArithmetic("0**-1") == std::nullopt);
  CHECK(EvaluateArithmetic("(-8)**(1/3)") == std::nullopt);  // complex in Python
  CHECK(EvaluateArithmetic("()") == std::nullopt);
  CHECK(EvaluateArithmetic("1 2") == std::nullopt);
  CHECK(EvaluateArithmetic("2(3)") == std::nullopt);
  CHECK(EvaluateArithmetic("(1+2") == std::nullopt);
  CHECK(EvaluateArithmetic("1..5") == std::nullopt);
  CHECK(EvaluateArithmetic("2 * * 3") == std::nullopt);
  CHECK(EvaluateArithmetic("1e5") == std::nullopt);
  CHECK(EvaluateArithmetic("") == std::nullopt);
  CHECK(EvaluateArithmetic(Repeat("(", 100000) + "1" + Repeat(")", 100000)) == std::nullopt);
  CHECK(EvaluateArithmetic(Repeat("-", 100000) + "1") == std::nullopt);
  CHECK(*EvaluateArithmetic("9**9**9") == HUGE_VAL);
}

TEST_CASE("exact_match and arithmetic", "[reward]") {
  CHECK(ExactMatchScore("  Paris\n", "Paris") == 1.0);
  CHECK(ExactMatchScore("paris", "Paris") == 0.0);
  CHECK(LeadingNumber(" 19 is the answer") == 19.0);
  CHECK(LeadingNumber("1,000") == 1000.0);
  CHECK(LeadingNumber("-5.25x") == -5.25);
  CHECK(LeadingNumber("12.") == 12.0);
  CHECK(LeadingNumber("The answer is 19") == std::nullopt);
  CHECK(LeadingNumber("-") == std::nullopt);
  CHECK(ArithmeticScore("19", 19) == 1.0);
  CHECK(ArithmeticScore("20", 19) == 0.1);
  CHECK(ArithmeticScore("nineteen", 19) == 0.0);
}

TEST_CASE("the registry implements every configurable rule", "[reward]") {
  std::vector<std::string_view> configurable;
  for (const config::RewardRuleInfo& rule : config::RewardRules()) {
    if (rule.name != "auto") configurable.push_back(rule.name);
  }
  CHECK(ImplementedRules() == configurable);
  CHECK(config::RewardRules().back().name == "auto");
}

TEST_CASE("auto picks the row that lists a data source", "[reward]") {
  CHECK(config::RuleForDataSource("openai/gsm8k") == "gsm8k");
  CHECK(config::RuleForDataSource("reasoning_gym/basic_arithmetic") == "gsm8k");
  CHECK(config::RuleForDataSource("reasoning_gym") == "");
  CHECK(config::RuleForDataSource("lighteval/MATH") == "math");
  CHECK(config::RuleForDataSource("DigitalLearningGmbH/MATH-lighteval") == "math");
  CHECK(config::RuleForDataSource("HuggingFaceH4/MATH-500") == "math");
  CHECK(config::RuleForDataSource("countdown") == "countdown");
  CHECK(config::RuleForDataSource("rlhfd/arithmetic") == "arithmetic");
  CHECK(config::RuleForDataSource("math") == "math_dapo");
  CHECK(config::RuleForDataSource("math_dapo_reasoning") == "math_dapo");
  CHECK(config::RuleForDataSource("aime2024") == "math_dapo");
  CHECK(config::RuleForDataSource("searchR1_nq") == "search_r1_qa_em");
  CHECK(config::RuleForDataSource("searchR1_bamboogle") == "search_r1_qa_em");
  CHECK(config::RuleForDataSource("nq") == "");
  CHECK(config::RuleForDataSource("openai/gsm8k2") == "");
  CHECK(config::RuleForDataSource("") == "");
  CHECK(config::KnownDataSources() ==
        "openai/gsm8k, reasoning_gym/*, lighteval/MATH, DigitalLearningGmbH/MATH-lighteval, "
        "HuggingFaceH4/MATH-500, math_dapo, math, math_dapo_reasoning, aime*, searchR1_nq, "
        "searchR1_triviaqa, searchR1_popqa, searchR1_hotpotqa, searchR1_2wikimultihopqa, "
        "searchR1_musique, searchR1_bamboogle, countdown, rlhfd/arithmetic");
}

TEST_CASE("rule rewards from data rows", "[reward]") {
  const RuleReward gsm8k = *RuleReward::Make("gsm8k");
  CHECK(*gsm8k.Score("#### 72", json("72"), "") == 1.0);
  CHECK(*gsm8k.Score("#### 72", json(72), "") == 1.0);  // a number as JSON writes it
  const absl::StatusOr<double> object_truth = gsm8k.Score("#### 72", json::object(), "");
  REQUIRE_FALSE(object_truth.ok());
  CHECK_THAT(std::string(object_truth.status().message()),
             Catch::Contains("ground truth") && Catch::Contains("object"));

  // The three gsm8k formats by name; auto keeps verl's default, strict, for openai/gsm8k.
  const std::string both = "3 apples, so #### 72 and finally 75";
  CHECK(*gsm8k.Score(both, json("72"), "") == 1.0);
  CHECK(*RuleReward::Make("gsm8k_flexible")->Score(both, json("72"), "") == 0.0);
  CHECK(*RuleReward::Make("gsm8k_flexible")->Score(both, json("75"), "") == 1.0);
  CHECK(*RuleReward::Make("gsm8k_flexible")->Score("1,000", json(1000), "") == 0.0);  // as verl
  CHECK(*RuleReward::Make("gsm8k_boxed")->Score("\\boxed{1,000}", json(1000), "") == 1.0);
  CHECK(*RuleReward::Make("gsm8k_boxed")->Score(both, json("72"), "openai/gsm8k") == 0.0);
  CHECK(config::RuleForDataSource("openai/gsm8k") == "gsm8k");
  CHECK_FALSE(RuleReward::Make("gsm8k_boxed")->Score("\\boxed{1}", json::array(), "").ok());

  const RuleReward countdown = *RuleReward::Make("countdown");
  CHECK(*countdown.Score("<answer>44 + 19 + 35</answer>",
                         json{{"target", 98}, {"numbers", {44, 19, 35}}}, "") == 1.0);
  CHECK_FALSE(countdown.Score("x", json("98"), "").ok());
  CHECK_FALSE(countdown.Score("x", json{{"target", 98}, {"numbers", {1.5}}}, "").ok());

  const RuleReward arithmetic = *RuleReward::Make("arithmetic");
  CHECK(*arithmetic.Score("12", json("12"), "") == 1.0);
  CHECK_FALSE(arithmetic.Score("12", json("twelve"), "").ok());

  const RuleReward automatic = *RuleReward::Make("auto");
  CHECK(*automatic.Score("#### 72", json("72"), "openai/gsm8k") == 1.0);
  CHECK(*automatic.Score("\\boxed{72}", json("72"), "lighteval/MATH") == 1.0);
  CHECK(*automatic.Score("#### 72", json("72"), "reasoning_gym/basic_arithmetic") == 1.0);
  const absl::StatusOr<double> unknown = automatic.Score("#### 72", json("72"), "my/dataset");
  REQUIRE_FALSE(unknown.ok());
  CHECK_THAT(std::string(unknown.status().message()),
             Catch::Contains("my/dataset") && Catch::Contains("HuggingFaceH4/MATH-500"));

  CHECK(*automatic.Score("Answer: 72", json("72"), "aime25") == 1.0);
  CHECK(*automatic.Score("<answer>Paris</answer>", json{{"target", {"paris", "Lyon"}}},
                         "searchR1_popqa") == 1.0);
  CHECK(*automatic.Score("<answer>Paris</answer>", json{{"target", "the Paris"}},
                         "searchR1_popqa") == 1.0);
  const absl::StatusOr<double> bare_target =
      automatic.Score("<answer>Paris</answer>", json("Paris"), "searchR1_nq");
  REQUIRE_FALSE(bare_target.ok());
  CHECK_THAT(std::string(bare_target.status().message()),
             Catch::Contains("{\"target\": text or [texts]}") && Catch::Contains("string"));
  CHECK_FALSE(automatic.Score("<answer>1</answer>", json{{"target", {1}}}, "searchR1_nq").ok());
  // verl's sources no rule reproduces are refused saying why and what to use instead.
  for (const char* source : {"hiyouga/geometry3k", "numina_olympiads", "apps", "taco"}) {
    const absl::StatusOr<double> refused = automatic.Score("x", json("x"), source);
    REQUIRE_FALSE(refused.ok());
    CHECK_THAT(std::string(refused.status().message()),
               Catch::Contains(source) && Catch::Contains("no native reward rule") &&
                   Catch::Contains("custom_reward_function"));
  }
  CHECK_THAT(std::string(automatic.Score("x", json("x"), "hiyouga/geometry3k").status().message()),
             Catch::Contains("mathruler"));

  const absl::StatusOr<RuleReward> bad = RuleReward::Make("gsm9k");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.status().message()),
             Catch::Contains("roles.reward.rule") &&
                 Catch::Contains("gsm8k, gsm8k_flexible, gsm8k_boxed, math"));
}

}  // namespace
}  // namespace rlhfd::reward
