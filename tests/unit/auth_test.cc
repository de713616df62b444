// Tokens: creation with safe permissions, reuse across restarts, client lookup order, checks.
#include <catch2/catch.hpp>
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <cstdlib>

#include "common/rpc/auth.h"
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

}  // namespace rlhfd
