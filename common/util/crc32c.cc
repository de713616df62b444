// CRC-32C: the hardware instruction on x86-64 with SSE4.2 (chosen once at run time, so one
// binary serves older CPUs too), a slicing-by-8 table elsewhere.
#include "common/util/crc32c.h"

#include <array>
#include <cstring>

#include "absl/strings/str_format.h"
#include "common/util/files.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace rlhfd {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // Castagnoli, bit-reversed

// tables[k][b]: the CRC of byte b followed by k zero bytes; slicing-by-8 folds eight bytes per
// round.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

const Tables& SliceTables() {
  static const Tables tables = [] {
    Tables t{};
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t crc = b;
      for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (kPolynomial & (0u - (crc & 1u)));
      t[0][b] = crc;
    }
    for (uint32_t b = 0; b < 256; ++b) {
      for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
    }
    return t;
  }();
  return tables;
}

// `crc` is the running register (pre-inverted).
uint32_t ExtendPortable(uint32_t crc, const unsigned char* p, size_t n) {
  const Tables& t = SliceTables();
  while (n >= 8) {
    uint32_t low, high;
    std::memcpy(&low, p, 4);
    std::memcpy(&high, p + 4, 4);
    low ^= crc;  // little-endian, as every host we build for
    crc = t[7][low & 0xFF] ^ t[6][(low >> 8) & 0xFF] ^ t[5][(low >> 16) & 0xFF] ^ t[4][low >> 24] ^
          t[3][high & 0xFF] ^ t[2][(high >> 8) & 0xFF] ^ t[1][(high >> 16) & 0xFF] ^
          t[0][high >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) crc = t[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const unsigned char* p,
                                                       size_t n) {
  uint64_t wide = crc;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    wide = _mm_crc32_u64(wide, word);
    p += 8;
    n -= 8;
  }
  crc = static_cast<uint32_t>(wide);
  while (n-- > 0) crc = _mm_crc32_u8(crc, *p++);
  return crc;
}

bool HasSse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

uint32_t Extend(uint32_t crc, const unsigned char* p, size_t n) {
#if defined(__x86_64__)
  if (HasSse42()) return ExtendSse42(crc, p, n);
#endif
  return ExtendPortable(crc, p, n);
}

}  // namespace

uint32_t Crc32cExtend(uint32_t crc, absl::string_view data) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
  return ~Extend(~crc, bytes, data.size());
}

uint32_t Crc32c(absl::string_view data) { return Crc32cExtend(0, data); }

uint32_t Crc32cPortable(absl::string_view data) {
  return ~ExtendPortable(~0u, reinterpret_cast<const unsigned char*>(data.data()), data.size());
}

absl::StatusOr<FileChecksum> Crc32cOfFile(const std::string& path) {
  FileChecksum sum;
  absl::StatusOr<int64_t> bytes = ReadFileInPieces(path, 4 << 20, [&](absl::string_view piece) {
    sum.crc32c = Crc32cExtend(sum.crc32c, piece);
  });
  if (!bytes.ok()) return bytes.status();
  sum.bytes = *bytes;
  return sum;
}

std::string Crc32cHex(uint32_t crc) { return absl::StrFormat("%08x", crc); }

}  // namespace rlhfd
