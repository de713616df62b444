// PythonJsonDumps against what Python 3.11's json.dumps(value, ensure_ascii=False) printed for the
// same values (written out by hand from its output).
#include "common/util/python_json.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

namespace rlhfd {
namespace {

TEST_CASE("PythonJsonDumps prints as Python's json.dumps", "[python_json]") {
  const std::pair<double, const char*> floats[] = {
      {0.0, "0.0"},         {-0.0, "-0.0"},
      {1.0, "1.0"},         {2e15, "2000000000000000.0"},
      {1e16, "1e+16"},      {1.5e16, "1.5e+16"},
      {1e-4, "0.0001"},     {1e-5, "1e-05"},
      {0.1, "0.1"},         {123.456, "123.456"},
      {1e22, "1e+22"},      {100.0, "100.0"},
      {2.5e-5, "2.5e-05"},  {12345678901234567.0, "1.2345678901234568e+16"},
      {0.00012, "0.00012"}, {-3.5e-300, "-3.5e-300"}};
  for (const auto& [value, python] : floats) {
    INFO(python);
    CHECK(PythonJsonDumps(nlohmann::ordered_json(value)) == python);
  }
  CHECK(PythonJsonDumps(nlohmann::ordered_json(std::nan(""))) == "NaN");
  CHECK(PythonJsonDumps(nlohmann::ordered_json(-std::numeric_limits<double>::infinity())) ==
        "-Infinity");
  // Keys in the value's order, ", " and ": ", non-ASCII kept, control characters escaped.
  const nlohmann::ordered_json value = nlohmann::ordered_json::parse(
      R"({"zeta": [1, -2, true, null], "alpha": {"é": "数学\n\"q\"\u0001"}, "": 18446744073709551615})");
  CHECK(PythonJsonDumps(value) ==
        "{\"zeta\": [1, -2, true, null], \"alpha\": {\"é\": \"数学\\n\\\"q\\\"\\u0001\"}, \"\": "
        "18446744073709551615}");
  // Bytes that are not UTF-8 are replaced, not thrown on.
  CHECK(PythonJsonDumps(nlohmann::ordered_json(std::string("a\xff"))) == "\"a\xef\xbf\xbd\"");
}

}  // namespace
}  // namespace rlhfd
