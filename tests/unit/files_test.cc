// File helpers: atomic replacement, size caps and error messages that name the path.
#include "common/util/files.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>

#include "absl/strings/match.h"
#include "tests/support/subprocess.h"

namespace rlhfd {

TEST_CASE("WriteFileAtomically replaces the file and sets its mode", "[files]") {
  testing::TempDir dir;
  const std::string path = dir.path() + "/state.json";
  REQUIRE(WriteFileAtomically(path, "first", 0600).ok());
  REQUIRE(WriteFileAtomically(path, "second").ok());
  auto contents = ReadFileToString(path);
  REQUIRE(contents.ok());
  CHECK(*contents == "second");
  struct stat st;
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0644);
  // No temporary files are left behind.
  CHECK(*ListDirectory(dir.path()) == std::vector<std::string>{"state.json"});
}

TEST_CASE("ReadFileToString errors name the path and refuse oversized files", "[files]") {
  testing::TempDir dir;
  auto missing = ReadFileToString(dir.path() + "/nope");
  CHECK(absl::IsNotFound(missing.status()));
  CHECK_THAT(std::string(missing.status().message()), Catch::Contains("/nope"));
  const std::string path = dir.path() + "/big";
  REQUIRE(WriteFileAtomically(path, std::string(2000, 'x')).ok());
  CHECK(absl::IsResourceExhausted(ReadFileToString(path, 1000).status()));
  CHECK(absl::IsInvalidArgument(ReadFileToString(dir.path()).status()));
}

TEST_CASE("directories are made, listed and removed", "[files]") {
  testing::TempDir dir;
  const std::string tree = dir.path() + "/a/b/c";
  REQUIRE(MakeDirectories(tree).ok());
  REQUIRE(MakeDirectories(tree).ok());  // Idempotent.
  CHECK(IsDirectory(tree));
  REQUIRE(WriteFileAtomically(tree + "/f", "x").ok());
  CHECK(PathExists(tree + "/f"));
  CHECK_FALSE(IsDirectory(tree + "/f"));
  CHECK(absl::IsFailedPrecondition(MakeDirectories(tree + "/f")));
  // Under a file: refused naming the path, nothing made.
  const absl::Status under_file = MakeDirectories(tree + "/f/g/h");
  CHECK_FALSE(under_file.ok());
  CHECK(absl::StrContains(under_file.message(), tree + "/f/g"));
  REQUIRE(MakeDirectories(tree + "/d/e/").ok());  // a trailing slash
  CHECK(IsDirectory(tree + "/d/e"));
  REQUIRE(RemoveTree(dir.path() + "/a").ok());
  CHECK_FALSE(PathExists(dir.path() + "/a"));
  CHECK(RemoveTree(dir.path() + "/a").ok());  // Already gone.
  CHECK(absl::IsNotFound(ListDirectory(dir.path() + "/a").status()));
}

TEST_CASE("CleanAbsolutePath: one spelling per absolute path, nothing that climbs", "[files]") {
  CHECK(CleanAbsolutePath("/a/b") == "/a/b");
  CHECK(CleanAbsolutePath("/a//b/./c/") == "/a/b/c");
  CHECK(CleanAbsolutePath("/") == "/");
  CHECK(CleanAbsolutePath("//") == "/");
  CHECK(CleanAbsolutePath("/a/../b").empty());
  CHECK(CleanAbsolutePath("/a/..").empty());
  CHECK(CleanAbsolutePath("a/b").empty());
  CHECK(CleanAbsolutePath("./a").empty());
  CHECK(CleanAbsolutePath("").empty());
  CHECK(CleanAbsolutePath("/a/..b/c..") == "/a/..b/c..");  // names, not parents
}

TEST_CASE("WriteFileAtomically into a missing directory fails cleanly", "[files]") {
  auto status = WriteFileAtomically("/nonexistent-dir/x", "data");
  CHECK_FALSE(status.ok());
  CHECK_THAT(std::string(status.message()), Catch::Contains("/nonexistent-dir"));
}

}  // namespace rlhfd
