// A safe evaluator for the arithmetic Python's eval() accepts from the characters verl's
// countdown reward allows (digits, + - * / ( ) . and whitespace): number literals as Python
// writes them, unary + and -, * / // and ** with Python's precedence and associativity. Nothing
// is executed; values are doubles (Python's exact integers differ only past 2^53).
#pragma once

#include <optional>
#include <string_view>

namespace rlhfd::reward {

// The value, or nullopt where Python's eval would raise (a syntax error, a division by zero) or
// give something that is not a real number (a tuple from "()", a complex power of a negative
// base).
std::optional<double> EvaluateArithmetic(std::string_view expression);

}  // namespace rlhfd::reward
