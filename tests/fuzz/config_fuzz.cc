// libFuzzer target: any bytes as a job config, the path SubmitJob takes (YAML or JSON text →
// JobSpec). Must parse or be refused with INVALID_ARGUMENT, never crash, and never take long:
// the loader's limits bound the work whatever the input.
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "common/config/job_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the syntax, as the file name does for a user.
  const char* source = data[0] % 2 == 0 ? "fuzz.yaml" : "fuzz.json";
  const absl::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const auto start = std::chrono::steady_clock::now();
  auto spec = rlhfd::config::ParseJobSpec(text, source);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!spec.ok() && spec.status().code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
  // Far beyond what a bounded parse of at most 1 MiB needs, even instrumented.
  if (seconds > 5.0) __builtin_trap();
  return 0;
}
