// workerd/speculation/commit.h: what a verified round commits (brief §6 "Commit").
//
// Round of request r with K_r queries at positions n_r .. n_r + K_r - 1 and A_r accepted proposals: positions
// n_r .. n_r + A_r are retained and the frontier becomes n'_r = n_r + A_r + 1 (the correction or bonus b_r sits at
// n'_r and is computed by the next round); the tail positions n'_r .. n_r + K_r - 1 are dropped (never published,
// never backed up). For a source with m positions per row, rows s with floor(n_r / m) <= s < floor(n'_r / m) are
// complete: they join immutable history and get their host backup scheduled; an incomplete row stays in the tail.
// Errors: INVALID_ARGUMENT for n_r < 0, K_r < 1, A_r outside [0, K_r - 1], m < 1. Thread-safety: pure.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/types.h"

namespace dhs::spec {

struct RoundCommit {
  Position frontier = 0;                  // n'_r = n_r + A_r + 1
  Position dropped_begin = 0;             // tail positions [dropped_begin, dropped_end) are discarded
  Position dropped_end = 0;               // n_r + K_r
  RowIndex complete_begin = 0;            // rows [complete_begin, complete_end) of the source join history
  RowIndex complete_end = 0;
};

absl::StatusOr<RoundCommit> CommitRound(Position n_r, int64_t k_r, int64_t accepted, int64_t positions_per_row);

}  // namespace dhs::spec
