#include "worker/reward/expression.h"

#include <charconv>
#include <cmath>

namespace rlhfd::reward {
namespace {

// Deeper nesting than any answer needs; bounds the recursion.
constexpr int kMaxDepth = 200;

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
                              c == '\v'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Python's float floor division (floatobject.c's float_floor_div), which differs from
// floor(x / y) where x / y rounds up to an integer: 1 // 0.1 is 9.0.
double FloorDivide(double x, double y) {
  double mod = std::fmod(x, y);
  double quotient = (x - mod) / y;
  if (mod != 0 && ((y < 0) != (mod < 0))) quotient -= 1.0;
  if (quotient == 0) return std::copysign(0.0, x / y);
  double floored = std::floor(quotient);
  if (quotient - floored > 0.5) floored += 1.0;
  return floored;
}

// Recursive descent over Python's grammar for these operators:
//   sum    := term (('+' | '-') term)*
//   term   := factor (('*' | '/' | '//') factor)*
//   factor := ('+' | '-') factor | power
//   power  := atom ['**' factor]
//   atom   := number | '(' sum ')'
class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  std::optional<double> Parse() {
    std::optional<double> value = Sum();
    SkipSpace();
    if (!value || position_ != text_.size() || failed_) return std::nullopt;
    return value;
  }

 private:
  void SkipSpace() {
    while (position_ < text_.size() && IsSpace(text_[position_])) ++position_;
  }
  bool Take(std::string_view token) {
    SkipSpace();
    if (text_.compare(position_, token.size(), token) != 0) return false;
    position_ += token.size();
    return true;
  }

  std::optional<double> Sum() {
    std::optional<double> value = Term();
    while (value) {
      if (Take("+")) {
        const std::optional<double> right = Term();
        if (!right) return std::nullopt;
        *value += *right;
      } else if (Take("-")) {
        const std::optional<double> right = Term();
        if (!right) return std::nullopt;
        *value -= *right;
      } else {
        break;
      }
    }
    return value;
  }

  std::optional<double> Term() {
    std::optional<double> value = Factor();
    while (value) {
      if (Take("//")) {
        const std::optional<double> right = Factor();
        if (!right || *right == 0) return std::nullopt;  // ZeroDivisionError
        *value = FloorDivide(*value, *right);
      } else if (Take("*")) {
        const std::optional<double> right = Factor();
        if (!right) return std::nullopt;
        *value *= *right;
      } else if (Take("/")) {
        const std::optional<double> right = Factor();
        if (!right || *right == 0) return std::nullopt;
        *value /= *right;
      } else {
        break;
      }
    }
    return value;
  }

  std::optional<double> Factor() {
    if (++depth_ > kMaxDepth) return Fail();
    std::optional<double> value;
    if (Take("+")) {
      value = Factor();
    } else if (Take("-")) {
      value = Factor();
      if (value) *value = -*value;
    } else {
      value = Power();
    }
    --depth_;
    return value;
  }

  std::optional<double> Power() {
    std::optional<double> base = Atom();
    if (!base || !Take("**")) return base;
    const std::optional<double> exponent = Factor();
    if (!exponent) return std::nullopt;
    if (*base == 0 && *exponent < 0) return std::nullopt;  // ZeroDivisionError
    // A negative base to a fractional power is complex in Python: never a real target.
    if (*base < 0 && std::floor(*exponent) != *exponent) return std::nullopt;
    return std::pow(*base, *exponent);
  }

  std::optional<double> Atom() {
    if (Take("(")) {
      if (++depth_ > kMaxDepth) return Fail();
      std::optional<double> value = Sum();
      --depth_;
      if (!value || !Take(")")) return std::nullopt;
      return value;
    }
    return Number();
  }

  // Python's literals from these characters: digits with an optional fraction ("1", "1.5",
  // "1.", ".5"); a decimal integer may not start with 0 unless it is all zeros.
  std::optional<double> Number() {
    SkipSpace();
    const size_t start = position_;
    while (position_ < text_.size() && IsDigit(text_[position_])) ++position_;
    const size_t integer_end = position_;
    bool fraction = false;
    if (position_ < text_.size() && text_[position_] == '.') {
      fraction = true;
      ++position_;
      while (position_ < text_.size() && IsDigit(text_[position_])) ++position_;
    }
    const std::string_view literal = text_.substr(start, position_ - start);
    if (literal.empty() || literal == ".") return std::nullopt;
    if (!fraction && literal.size() > 1 && literal[0] == '0' &&
        literal.find_first_not_of('0') != std::string_view::npos) {
      return std::nullopt;  // "leading zeros in decimal integer literals are not permitted"
    }
    double value = 0;
    const auto [end, error] = std::from_chars(literal.data(), literal.data() + literal.size(), value);
    if (error == std::errc::result_out_of_range) {
      // Past double's range: Python's float literal is inf; below it (a long "0.000…1"), 0.
      return integer_end - start > 300 ? HUGE_VAL : 0.0;
    }
    if (error != std::errc() || end != literal.data() + literal.size()) return std::nullopt;
    return value;
  }

  std::optional<double> Fail() {
    failed_ = true;
    return std::nullopt;
  }

  std::string_view text_;
  size_t position_ = 0;
  int depth_ = 0;
  bool failed_ = false;
};

}  // namespace

std::optional<double> EvaluateArithmetic(std::string_view expression) {
  for (char c : expression) {
    const bool allowed = IsDigit(c) || IsSpace(c) || c == '+' || c == '-' || c == '*' ||
                         c == '/' || c == '(' || c == ')' || c == '.';
    if (!allowed) return std::nullopt;
  }
  if (expression.empty()) return std::nullopt;
  std::optional<double> value = Parser(expression).Parse();
  if (value && std::isnan(*value)) return std::nullopt;
  return value;
}

}  // namespace rlhfd::reward
