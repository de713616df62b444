// The docs that tables of code are copied into stay in step with the code: every verl key the
// converter maps directly appears in docs/coming-from-verl.md with where it lands.
#include <catch2/catch.hpp>

#include "absl/strings/str_cat.h"
#include "common/config/verl_import.h"
#include "common/util/files.h"

namespace rlhfd::config {

TEST_CASE("coming-from-verl.md lists every direct mapping", "[docs]") {
  auto doc = ReadFileToString(std::string(RLHFD_DOCS_DIR) + "/coming-from-verl.md");
  REQUIRE(doc.ok());
  for (const auto& [verl, ours] : VerlDirectMappings()) {
    INFO(verl);
    CHECK_THAT(*doc, Catch::Contains(absl::StrCat("| `", verl, "` | `", ours, "` |")));
  }
}

}  // namespace rlhfd::config
