// The logging facade: one line per call on stderr, with the context fields of the work in hand,
// restored when a scope ends; the rate-limited variant; text checks of common/util/text.h.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <string>

#include "common/logging/logging.h"
#include "common/util/files.h"
#include "common/util/text.h"
#include "tests/support/subprocess.h"

namespace rlhfd {
namespace {

// What `body` writes to stderr.
template <typename Body>
std::string CaptureStderr(Body body) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/stderr";
  const int file = ::open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
  REQUIRE(file >= 0);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(file, STDERR_FILENO);
  body();
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  ::close(file);
  auto text = ReadFileToString(path);
  REQUIRE(text.ok());
  return *text;
}

}  // namespace

TEST_CASE("log lines carry the job, role, rank and step of their scope", "[logging]") {
  const std::string out = CaptureStderr([] {
    RLOG(INFO) << "before";
    {
      logging::ScopedLogContext job({.job = "job-3", .role = "actor", .rank = 1, .step = 7});
      RLOG(WARNING) << "inside";
      {
        logging::ScopedLogContext inner({.job = "job-4"});
        RLOG(ERROR) << "nested";
      }
      RLOG(INFO) << "restored";
    }
    RLOG(INFO) << "after";
    RLOG(DEBUG) << "below the threshold";
  });
  CHECK_THAT(out, Catch::Contains("] before\n"));
  CHECK_THAT(out, Catch::Contains("[job=job-3 role=actor rank=1 step=7] inside\n"));
  CHECK_THAT(out, Catch::Contains("[job=job-4] nested\n"));
  CHECK_THAT(out, Catch::Contains("[job=job-3 role=actor rank=1 step=7] restored\n"));
  CHECK_THAT(out, Catch::Contains("] after\n"));
  CHECK_THAT(out, !Catch::Contains("below the threshold"));
  CHECK_THAT(out, Catch::StartsWith("I ") && Catch::Contains("\nW ") && Catch::Contains("\nE "));
}

TEST_CASE("rate-limited lines are written once per interval", "[logging]") {
  const std::string out = CaptureStderr([] {
    for (int i = 0; i < 100; ++i) RLOG_EVERY_N_SEC(INFO, 60) << "hot loop " << i;
  });
  CHECK_THAT(out, Catch::Contains("hot loop 0"));
  CHECK_THAT(out, !Catch::Contains("hot loop 1"));
}

TEST_CASE("text from outside is checked and made safe to show", "[text]") {
  CHECK(IsValidUtf8("plain ascii"));
  CHECK(IsValidUtf8("日本語 😀"));
  CHECK_FALSE(IsValidUtf8("\xA0"));          // a lone continuation byte (YAML's \_ escape)
  CHECK_FALSE(IsValidUtf8("\xC0\xAF"));      // overlong '/'
  CHECK_FALSE(IsValidUtf8("\xED\xA0\x80"));  // a surrogate
  CHECK_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // past U+10FFFF
  CHECK(FirstInvalidUtf8("ok\xFFok") == 2);
  CHECK(FirstControlCharacter("tab\there") == '\t');
  CHECK(FirstControlCharacter("esc\x1b[2J") == 0x1b);
  CHECK(FirstControlCharacter("c1 \xC2\x85") == 0x85);
  CHECK(FirstControlCharacter("fine") == -1);
  CHECK(SanitizeForDisplay("a\x1b[31mred\xFFz") == "a\\x1B[31mred\xEF\xBF\xBDz");
  CHECK(SanitizeForDisplay(std::string(500, 'x'), 10) == "xxxxxxxxxx...");
  CHECK(TruncateUtf8("日本", 4) == "日");  // Never half a character.
  CHECK(TruncateUtf8("日本", 6) == "日本");
  CHECK(TruncateUtf8("a\xC3\xA9", 2) == "a");
  // Bytes that are not UTF-8 are cut at the count, not backed over.
  CHECK(TruncateUtf8(std::string(10, '\x80'), 5) == std::string(5, '\x80'));
  CHECK(WithoutCutUtf8Tail("ok\xF0\x9F\x98") == "ok");  // 3 of an emoji's 4 bytes
  CHECK(WithoutCutUtf8Tail("ok\xF0\x9F\x98\x80") == "ok\xF0\x9F\x98\x80");
  CHECK(WithoutCutUtf8Tail("\x80\x80\x80\x80\x80") == "\x80\x80\x80\x80\x80");
  CHECK(WithoutCutUtf8Tail("") == "");
}

// The expected values are Python 3's str.strip() of the same text.
TEST_CASE("Python's strip: Unicode whitespace at either end", "[text]") {
  CHECK(StripPythonWhitespace(" \t\n\v\f\r x y \x1c\x1f") == "x y");
  // U+00A0, U+3000 and U+2003 (hex escapes end where a string does: "\x80" "a").
  CHECK(StripPythonWhitespace("\xC2\xA0\xE3\x80\x80"
                              "a\xE2\x80\x83"
                              "b\xE2\x80\x83") ==
        "a\xE2\x80\x83"
        "b");
  CHECK(StripPythonWhitespace("\xC2\x85x\xE2\x80\xA8") == "x");      // U+0085, U+2028
  CHECK(StripPythonWhitespace("\xE2\x80\x8Bx") == "\xE2\x80\x8Bx");  // U+200B is not space
  CHECK(StripPythonWhitespace(" \x80 ") == "\x80");                  // a malformed byte is kept
  CHECK(StripPythonWhitespace(" \xE3\x80\x80 ").empty());
  CHECK(StripPythonWhitespace("").empty());
}

}  // namespace rlhfd
