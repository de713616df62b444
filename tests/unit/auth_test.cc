// Tokens: creation with safe permissions, reuse across restarts, client lookup order, and what
// the admin and read-only tokens each open.
#include "common/rpc/auth.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstdlib>

#include "absl/strings/escaping.h"
#include "common/util/files.h"
#include "tests/support/subprocess.h"

namespace rlhfd {

TEST_CASE("the controller token is created once, private, and reused", "[auth]") {
  testing::TempDir dir;
  const std::string state = dir.path() + "/state";
  auto first = LoadOrCreateToken(state);
  REQUIRE(first.ok());
  CHECK(first->size() == 64);
  struct stat st;
  REQUIRE(::stat((state + "/token").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  auto second = LoadOrCreateToken(state);
  REQUIRE(second.ok());
  CHECK(*second == *first);
  auto other = GenerateToken();
  REQUIRE(other.ok());
  CHECK(*other != *first);
}

TEST_CASE("an empty token file is refused, not trusted", "[auth]") {
  testing::TempDir dir;
  REQUIRE(WriteFileAtomically(dir.path() + "/token", "\n").ok());
  CHECK(absl::IsFailedPrecondition(LoadOrCreateToken(dir.path()).status()));
}

TEST_CASE("client token: flag, then environment, then file", "[auth]") {
  testing::TempDir dir;
  REQUIRE(WriteFileAtomically(dir.path() + "/token", "from-file\n").ok());
  ::unsetenv("RLHFD_TOKEN");
  ::unsetenv("RLHFD_TOKEN_FILE");
  CHECK(*ResolveClientToken("from-flag", dir.path() + "/token") == "from-flag");
  CHECK(*ResolveClientToken("", dir.path() + "/token") == "from-file");
  ::setenv("RLHFD_TOKEN", "from-env", 1);
  CHECK(*ResolveClientToken("", dir.path() + "/token") == "from-env");
  ::unsetenv("RLHFD_TOKEN");
  auto none = ResolveClientToken("", "");
  REQUIRE_FALSE(none.ok());
  CHECK_THAT(std::string(none.status().message()), Catch::Contains("--token_file"));
  CHECK(absl::IsNotFound(ResolveClientToken("", dir.path() + "/missing").status()));
}

TEST_CASE("each token file is its own token", "[auth]") {
  testing::TempDir dir;
  auto admin = LoadOrCreateToken(dir.path(), kAdminTokenFile);
  auto reader = LoadOrCreateToken(dir.path(), kReadTokenFile);
  auto stage = LoadOrCreateToken(dir.path(), kStageTokenFile);
  REQUIRE(admin.ok());
  REQUIRE(reader.ok());
  REQUIRE(stage.ok());
  CHECK(*admin != *reader);
  CHECK(*admin != *stage);
  CHECK(*reader != *stage);
  CHECK(*LoadOrCreateToken(dir.path(), kReadTokenFile) == *reader);
}

TEST_CASE("the admin token opens everything, the read-only token only reads", "[auth]") {
  const ClientTokens tokens{.admin = "admin-token", .read_only = "read-token"};
  const auto check = [&](const std::string& header, Access needed) {
    return CheckHttpAccess(&header, tokens, needed);
  };
  CHECK(check("Bearer admin-token", Access::kAdmin).ok());
  CHECK(check("Bearer admin-token", Access::kRead).ok());
  CHECK(check("Bearer read-token", Access::kRead).ok());
  const absl::Status refused = check("Bearer read-token", Access::kAdmin);
  CHECK(absl::IsPermissionDenied(refused));
  CHECK_THAT(std::string(refused.message()), Catch::Contains("<controller state dir>/token"));
  CHECK(check("Basic " + absl::Base64Escape("prometheus:read-token"), Access::kRead).ok());
  CHECK(absl::IsPermissionDenied(
      check("Basic " + absl::Base64Escape("x:read-token"), Access::kAdmin)));
  CHECK(absl::IsUnauthenticated(check("Bearer read-token ", Access::kRead)));
  CHECK(absl::IsUnauthenticated(check("Bearer admin", Access::kRead)));
  CHECK(absl::IsUnauthenticated(check("Bearer ", Access::kRead)));
  CHECK(absl::IsUnauthenticated(check("admin-token", Access::kRead)));
  CHECK(absl::IsUnauthenticated(CheckHttpAccess(nullptr, tokens, Access::kRead)));
  // No read-only token configured: an empty one opens nothing.
  const ClientTokens admin_only{.admin = "admin-token"};
  const std::string empty = "Bearer ";
  CHECK(absl::IsUnauthenticated(CheckHttpAccess(&empty, admin_only, Access::kRead)));
}

}  // namespace rlhfd
