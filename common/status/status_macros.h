// RETURN_IF_ERROR / ASSIGN_OR_RETURN: early returns for absl::Status and absl::StatusOr.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define RLHFD_STATUS_CONCAT_INNER(a, b) a##b
#define RLHFD_STATUS_CONCAT(a, b) RLHFD_STATUS_CONCAT_INNER(a, b)

// Returns the status of `expr` from the enclosing function if it is not OK.
#define RETURN_IF_ERROR(expr)                                    \
  do {                                                           \
    if (::absl::Status rlhfd_status_ = (expr); !rlhfd_status_.ok()) { \
      return rlhfd_status_;                                      \
    }                                                            \
  } while (false)

// `ASSIGN_OR_RETURN(auto x, Fn());` declares x from an OK StatusOr or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  RLHFD_ASSIGN_OR_RETURN_IMPL(RLHFD_STATUS_CONCAT(rlhfd_statusor_, __LINE__), lhs, expr)

#define RLHFD_ASSIGN_OR_RETURN_IMPL(statusor, lhs, expr) \
  auto statusor = (expr);                                \
  if (!statusor.ok()) {                                  \
    return std::move(statusor).status();                 \
  }                                                      \
  lhs = std::move(statusor).value()
