// Status helpers shared by every module: absl::Status / StatusOr plus the propagation macros.
// Only main() may exit; everything else returns a Status.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define DFLASH_STATUS_CONCAT_INNER(a, b) a##b
#define DFLASH_STATUS_CONCAT(a, b) DFLASH_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status _dflash_status = (expr);          \
    if (!_dflash_status.ok()) return _dflash_status; \
  } while (0)

// ASSIGN_OR_RETURN(auto x, MakeX()): assigns the value of a StatusOr or returns its error.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  DFLASH_ASSIGN_OR_RETURN_IMPL(DFLASH_STATUS_CONCAT(_dflash_statusor_, __LINE__), lhs, rexpr)
#define DFLASH_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                 \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

namespace dflash {

// Prefixes a status message with context, keeping the code: "loading run.yaml: <original>".
inline absl::Status Annotate(const absl::Status& s, absl::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

// A Status that carries the source location, for errors from CUDA/NCCL/system calls.
#define DFLASH_INTERNAL_ERROR(msg) \
  ::absl::InternalError(::absl::StrCat(msg, " (", __FILE__, ":", __LINE__, ")"))

}  // namespace dflash
