// CRC-32C (Castagnoli): the checksum of checkpoint files and of TensorBoard's TFRecord framing.
// The CPU's crc32 instruction (SSE4.2) where there is one, else a slicing-by-8 table.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace rlhfd {

// CRC-32C of `data` ("123456789" gives 0xE3069283).
uint32_t Crc32c(absl::string_view data);
// The CRC of the bytes `crc` covers followed by `data`: Crc32cExtend(Crc32c(a), b) ==
// Crc32c(a + b), so large inputs can be summed in pieces.
uint32_t Crc32cExtend(uint32_t crc, absl::string_view data);

// The table implementation whatever the CPU has, so tests can hold the two to each other.
uint32_t Crc32cPortable(absl::string_view data);

// A file's CRC-32C and size, read in pieces (a multi-GB shard is never held in memory).
struct FileChecksum {
  uint32_t crc32c = 0;
  int64_t bytes = 0;
};
absl::StatusOr<FileChecksum> Crc32cOfFile(const std::string& path);

// Eight lower-case hex digits, as checkpoint manifests record a CRC.
std::string Crc32cHex(uint32_t crc);

}  // namespace rlhfd
