#include "common/util/python_json.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string_view>

namespace rlhfd {
namespace {

// A float as Python's repr writes it: the shortest digits that read back as the same double,
// positional when the decimal exponent is in [-4, 16) (with ".0" on a whole number), else
// d.ddde+XX; NaN and Infinity as json.dumps writes them.
void AppendFloat(double value, std::string& out) {
  if (std::isnan(value)) {
    out += "NaN";
    return;
  }
  if (std::isinf(value)) {
    out += value < 0 ? "-Infinity" : "Infinity";
    return;
  }
  char buffer[64];
  const auto [end, error] =
      std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific);
  const std::string_view text(buffer, error == std::errc() ? end - buffer : 0);
  // "-d.ddde+XX": the sign, the digits without the point, and the exponent.
  const bool negative = !text.empty() && text[0] == '-';
  const size_t e = text.find('e');
  std::string digits;
  for (char c : text.substr(negative ? 1 : 0, e - (negative ? 1 : 0))) {
    if (c != '.') digits += c;
  }
  const int exponent = std::atoi(std::string(text.substr(e + 1)).c_str());
  if (negative) out += '-';
  if (exponent < -4 || exponent >= 16) {
    out += digits[0];
    if (digits.size() > 1) out.append(".").append(digits, 1);
    out += exponent < 0 ? "e-" : "e+";
    const int magnitude = std::abs(exponent);
    if (magnitude < 10) out += '0';
    out += std::to_string(magnitude);
  } else if (exponent < 0) {
    out.append("0.").append(static_cast<size_t>(-exponent - 1), '0').append(digits);
  } else if (static_cast<size_t>(exponent) + 1 >= digits.size()) {
    out.append(digits).append(static_cast<size_t>(exponent) + 1 - digits.size(), '0').append(".0");
  } else {
    out.append(digits, 0, exponent + 1).append(".").append(digits, exponent + 1);
  }
}

void Dump(const nlohmann::ordered_json& value, std::string& out) {
  if (value.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [key, item] : value.items()) {
      if (!first) out += ", ";
      first = false;
      Dump(nlohmann::ordered_json(key), out);
      out += ": ";
      Dump(item, out);
    }
    out += '}';
  } else if (value.is_array()) {
    out += '[';
    for (size_t i = 0; i < value.size(); ++i) {
      if (i > 0) out += ", ";
      Dump(value[i], out);
    }
    out += ']';
  } else if (value.is_number_float()) {
    AppendFloat(value.get<double>(), out);
  } else {
    out += value.dump(-1, ' ', /*ensure_ascii=*/false,
                      nlohmann::ordered_json::error_handler_t::replace);
  }
}

}  // namespace

std::string PythonJsonDumps(const nlohmann::ordered_json& value) {
  std::string out;
  Dump(value, out);
  return out;
}

}  // namespace rlhfd
