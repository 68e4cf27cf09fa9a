// workerd/speculation/draft_ring.h: the drafter's KV ring (brief §6 "Draft KV ring", §8 "with a drafter").
//
// Geometry: a drafter reads at most W prior positions plus a block of K_max, so with p rows per page each request slot
// holds R_d = p * ceil((W + K_max + p - 1) / p) rows (whole pages: the window's first position need not start a page).
// Slot i, position t lives at row phi(i, t) = i * R_d + (t mod R_d). Draft memory does not grow with the target's
// context: N * R_d * draft_bytes_per_row bytes in all.
//
// DraftRing keeps, per slot, the committed frontier n (positions < n are the drafter's committed history) and the
// pending block (positions n .. n + pending - 1 written during this round's proposals, not yet verified). The live
// window of a slot is [max(start, n - W), n + pending). Write appends one pending position; Commit(slot, A) keeps the
// first A pending positions (the accepted prefix: the frontier moves by A, brief §6 "The drafter's state advances with
// the same prefix") and drops the rest; Rollback drops every pending position. Rows of dropped positions are simply
// overwritten later. Because R_d >= W + K_max, no two positions of a live window share a row.
//
// Pure state: no clocks, no I/O. Errors (absl::Status): INVALID_ARGUMENT for a configuration or a call that cannot be
// honoured; the state is unchanged by any failing call. Thread-safety: none.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/types.h"

namespace dhs::spec {

// The drafter's ring sizes. window (W, positions), k_max (queries per round, anchor included), page_rows (p, rows per
// page), slots (N request slots). ring_rows: the rows per slot the deployment provides (0 = exactly R_d).
struct DraftRingConfig {
  int64_t window = 0;
  int64_t k_max = 0;
  int64_t page_rows = 0;
  uint32_t slots = 0;
  int64_t ring_rows = 0;
  int64_t draft_bytes_per_row = 0;  // bytes of all draft layers for one position (0: bytes not needed)
};

// R_d = p * ceil((W + K_max + p - 1) / p) rows (brief §6). All arguments >= 1; no overflow check (use Create).
int64_t DraftRingRows(int64_t window, int64_t k_max, int64_t page_rows);

class DraftRingGeometry {
 public:
  // Checks W >= 1, K_max >= 1, p >= 1, N >= 1 and, when ring_rows > 0, that ring_rows is whole pages holding at
  // least R_d rows: otherwise INVALID_ARGUMENT naming W, K_max, p, the formula's R_d and the largest K_max the ring
  // allows.
  static absl::StatusOr<DraftRingGeometry> Create(const DraftRingConfig& config);

  const DraftRingConfig& config() const { return config_; }
  int64_t rows_per_slot() const { return rows_per_slot_; }          // R_d (or the configured ring_rows)
  int64_t total_rows() const { return rows_per_slot_ * config_.slots; }
  int64_t bytes() const { return total_rows() * config_.draft_bytes_per_row; }  // N * R_d * draft_bytes_per_row
  // phi(i, t) = i * R_d + (t mod R_d); slot < N, t >= 0.
  int64_t Row(SlotIndex slot, Position t) const { return slot * rows_per_slot_ + t % rows_per_slot_; }

 private:
  DraftRingConfig config_;
  int64_t rows_per_slot_ = 0;
};

class DraftRing {
 public:
  explicit DraftRing(DraftRingGeometry geometry);

  const DraftRingGeometry& geometry() const { return geometry_; }
  // Opens a slot for a request whose drafter history starts at position `start` (>= 0): frontier = start, no pending.
  absl::Status Open(SlotIndex slot, Position start);
  absl::Status Close(SlotIndex slot);  // frees the slot (pending positions dropped)
  // The next pending position (frontier + pending) gets a row: refused when the block already has K_max positions.
  absl::StatusOr<int64_t> Write(SlotIndex slot);
  // Keeps the first `accepted` pending positions (0 <= accepted <= pending) and drops the rest.
  absl::Status Commit(SlotIndex slot, int64_t accepted);
  absl::Status Rollback(SlotIndex slot) { return Commit(slot, 0); }
  // The row of a position in the live window; INVALID_ARGUMENT outside it (older than W or not yet written).
  absl::StatusOr<int64_t> ReadRow(SlotIndex slot, Position t) const;

  bool open(SlotIndex slot) const { return slot < slots_.size() && slots_[slot].open; }
  Position frontier(SlotIndex slot) const { return slots_[slot].frontier; }
  int64_t pending(SlotIndex slot) const { return slots_[slot].pending; }
  Position window_begin(SlotIndex slot) const;  // max(start, frontier - W)

 private:
  struct SlotState {
    bool open = false;
    Position start = 0, frontier = 0;
    int64_t pending = 0;
  };
  absl::Status CheckOpen(SlotIndex slot) const;

  DraftRingGeometry geometry_;
  std::vector<SlotState> slots_;
};

}  // namespace dhs::spec
