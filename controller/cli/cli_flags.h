// rlhfctl's own flags (the RPC flags are common/rpc/rpc_flags.h's), read by its commands.
#pragma once

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "absl/time/time.h"

ABSL_DECLARE_FLAG(std::string, controller);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(absl::Duration, timeout);
ABSL_DECLARE_FLAG(bool, wait);
ABSL_DECLARE_FLAG(bool, follow);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(int64_t, step);
ABSL_DECLARE_FLAG(bool, merged);
ABSL_DECLARE_FLAG(int32_t, page_size);
