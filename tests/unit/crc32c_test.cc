// CRC-32C: the published check values, the hardware and table paths against each other at every
// length and alignment, extension in pieces, and a file's checksum read in pieces.
#include "common/util/crc32c.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>

#include "common/util/files.h"
#include "tests/support/subprocess.h"

namespace rlhfd {
namespace {

std::string RandomBytes(size_t size, uint32_t seed) {
  std::mt19937 generator(seed);
  std::string bytes(size, '\0');
  for (char& c : bytes) c = static_cast<char>(generator() & 0xFF);
  return bytes;
}

TEST_CASE("CRC-32C gives the published check values", "[crc32c]") {
  // RFC 3720 (iSCSI) B.4 and the usual "123456789" check value.
  CHECK(Crc32c("123456789") == 0xE3069283u);
  CHECK(Crc32c("") == 0u);
  CHECK(Crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(Crc32c(std::string(32, '\xff')) == 0x62A8AB43u);
  std::string ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i);
  CHECK(Crc32c(ascending) == 0x46DD794Eu);
  CHECK(Crc32cPortable("123456789") == 0xE3069283u);
  CHECK(Crc32cHex(0xE3069283u) == "e3069283");
  CHECK(Crc32cHex(0x1u) == "00000001");
}

TEST_CASE("the fast and the table CRC agree at every length and alignment", "[crc32c]") {
  const std::string bytes = RandomBytes(4096 + 16, 7);
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t size : {0, 1, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 255, 1000, 4096}) {
      const absl::string_view piece(bytes.data() + offset, size);
      INFO("offset " << offset << " size " << size);
      CHECK(Crc32c(piece) == Crc32cPortable(piece));
    }
  }
}

TEST_CASE("a CRC extended piece by piece equals the CRC of the whole", "[crc32c]") {
  const std::string bytes = RandomBytes(10000, 11);
  for (size_t cut : {0, 1, 5, 8, 4999, 9999, 10000}) {
    INFO("cut at " << cut);
    const uint32_t first = Crc32c(absl::string_view(bytes).substr(0, cut));
    CHECK(Crc32cExtend(first, absl::string_view(bytes).substr(cut)) == Crc32c(bytes));
  }
  // One flipped bit changes it.
  std::string flipped = bytes;
  flipped[1234] ^= 0x10;
  CHECK(Crc32c(flipped) != Crc32c(bytes));
}

TEST_CASE("a file's CRC-32C is read in pieces and names a missing file", "[crc32c]") {
  testing::TempDir dir;
  const std::string path = dir.path() + "/shard";
  // Larger than one 4 MiB read, not a multiple of it.
  const std::string bytes = RandomBytes((9 << 20) + 5, 3);
  REQUIRE(WriteFileAtomically(path, bytes).ok());
  auto sum = Crc32cOfFile(path);
  REQUIRE(sum.ok());
  CHECK(sum->bytes == static_cast<int64_t>(bytes.size()));
  CHECK(sum->crc32c == Crc32c(bytes));
  auto missing = Crc32cOfFile(dir.path() + "/nope");
  CHECK(absl::IsNotFound(missing.status()));
  CHECK_THAT(std::string(missing.status().message()), Catch::Contains(dir.path() + "/nope"));
}

}  // namespace
}  // namespace rlhfd
