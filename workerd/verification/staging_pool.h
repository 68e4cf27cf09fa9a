// workerd/verification/staging_pool.h: the verification staging arenas of one GPU (brief §6 "Staging", §8 "with a
// drafter").
//
// A layer group has χ payload sources live at once; each live source of the group uses one arena, which holds
// K_max * k rows for each of the N request slots (rows of a round's union beyond the hot cache, union_plan.h).
// After all readers (consumers) of an arena's source finished, the arena is free and the next layer group reuses it.
// Bytes: M_stage = χ * N * K_max * k * d_KV (brief §6), a required allocation declared to memd.
//
// StagingArenaPool is pure bookkeeping: Acquire(group, source, readers) hands a free arena to a source of a layer
// group with its reader count; ReleaseReader(arena) records one finished reader and frees the arena at zero. Rows
// promoted into the hot cache must be copied back before the last reader releases (the caller's order, brief §6).
// Errors (the state is unchanged by any failing call): RESOURCE_EXHAUSTED when no arena is free (the caller waits for
// readers of the previous group), INVALID_ARGUMENT for readers = 0, an arena out of range, a release of a free arena,
// or a (group, source) that already holds an arena. Thread-safety: none.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dhs::spec {

struct StagingShape {
  uint32_t arenas = 0;     // χ
  uint32_t slots = 0;      // N request slots
  int64_t k_max = 0;       // K_max queries per round
  int64_t k = 0;           // rows per selection
  int64_t row_bytes = 0;   // d_KV bytes per stored row
};

// M_stage = χ * N * K_max * k * d_KV bytes (brief §6 "Staging"); INVALID_ARGUMENT for a zero factor or overflow.
absl::StatusOr<int64_t> StagingReservationBytes(const StagingShape& shape);

// The byte offset of staging row `row` (< K_max * k) of request slot `slot` (< N) in arena `arena` (< χ), arenas laid
// out one after another, each slot-major: ((arena * N + slot) * K_max * k + row) * d_KV. Unchecked.
int64_t StagingRowOffset(const StagingShape& shape, uint32_t arena, uint32_t slot, int64_t row);

class StagingArenaPool {
 public:
  explicit StagingArenaPool(uint32_t arenas);

  uint32_t arenas() const { return static_cast<uint32_t>(arenas_.size()); }
  // A free arena (lowest index) for source `source` of layer group `group`, with `readers` >= 1 outstanding readers.
  absl::StatusOr<uint32_t> Acquire(uint32_t group, uint32_t source, uint32_t readers);
  // One reader of `arena` finished; returns true when that was the last (the arena is free again).
  absl::StatusOr<bool> ReleaseReader(uint32_t arena);

  uint32_t readers(uint32_t arena) const { return arenas_[arena].readers; }
  uint32_t free_arenas() const;

 private:
  struct Arena {
    uint32_t readers = 0;  // 0 = free
    uint32_t group = 0, source = 0;
  };
  std::vector<Arena> arenas_;
};

}  // namespace dhs::spec
