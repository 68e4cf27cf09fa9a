// common/check.h: DHS_CHECK_OK, the checked assertion on a status that cannot fail.
//
// A call whose failure would mean a bug (a broken invariant, not bad input) says so with DHS_CHECK_OK(expr): `expr`
// is evaluated once and, when it is not OK, the file, line, expression and status are printed to stderr and the
// process aborts. Active in every build type (unlike assert()). A status that can fail for a legitimate reason is
// handled instead, never discarded with (void). Header-only, depends on absl only (memd's core includes it and stays
// free of ZeroMQ and FlatBuffers).
//
// Thread-safety: stateless.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"

namespace dhs::internal {
[[noreturn]] inline void CheckFailed(const char* file, int line, const char* expr, const absl::Status& status) {
  std::fprintf(stderr, "%s:%d: CHECK failed: %s: %s\n", file, line, expr, status.ToString().c_str());
  std::fflush(stderr);
  std::abort();
}
}  // namespace dhs::internal

#define DHS_CHECK_OK(expr)                                                                                   \
  do {                                                                                                       \
    const ::absl::Status dhs_check_status_ = (expr);                                                         \
    if (!dhs_check_status_.ok()) ::dhs::internal::CheckFailed(__FILE__, __LINE__, #expr, dhs_check_status_); \
  } while (0)
