#include "workerd/speculation/draft_ring.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"

namespace dhs::spec {
namespace {
constexpr int64_t kMaxSize = int64_t{1} << 40;  // keeps every product below 2^63
}  // namespace

int64_t DraftRingRows(int64_t window, int64_t k_max, int64_t page_rows) {
  const int64_t pages = (window + k_max + page_rows - 1 + page_rows - 1) / page_rows;
  return page_rows * pages;
}

absl::StatusOr<DraftRingGeometry> DraftRingGeometry::Create(const DraftRingConfig& c) {
  if (c.window < 1 || c.k_max < 1 || c.page_rows < 1 || c.slots < 1 || c.window > kMaxSize || c.k_max > kMaxSize ||
      c.page_rows > kMaxSize || c.ring_rows < 0 || c.ring_rows > kMaxSize || c.draft_bytes_per_row < 0 ||
      c.draft_bytes_per_row > kMaxSize) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "draft ring: W=%d, K_max=%d, p=%d, N=%d must each be in [1, 2^40]; ring_rows=%d and draft_bytes_per_row=%d "
        "in [0, 2^40]",
        c.window, c.k_max, c.page_rows, c.slots, c.ring_rows, c.draft_bytes_per_row));
  }
  const int64_t need = DraftRingRows(c.window, c.k_max, c.page_rows);
  DraftRingGeometry g;
  g.config_ = c;
  g.rows_per_slot_ = need;
  if (c.ring_rows > 0) {
    if (c.ring_rows % c.page_rows != 0 || c.ring_rows < need) {
      // Largest K with p * ceil((W + K + p - 1) / p) <= ring_rows (whole pages of the ring only).
      const int64_t whole = c.ring_rows / c.page_rows * c.page_rows;
      const int64_t k_fit = whole - c.window - c.page_rows + 1;
      return absl::InvalidArgumentError(absl::StrFormat(
          "draft ring of %d rows per slot cannot hold the window and a block: R_d = p * ceil((W + K_max + p - 1) / p)"
          " = %d * ceil((%d + %d + %d - 1) / %d) = %d rows%s; with W=%d and p=%d this ring allows K_max <= %d",
          c.ring_rows, c.page_rows, c.window, c.k_max, c.page_rows, c.page_rows, need,
          c.ring_rows % c.page_rows != 0 ? absl::StrFormat(" (and %d is not whole pages of %d)", c.ring_rows,
                                                           c.page_rows)
                                         : std::string(),
          c.window, c.page_rows, std::max<int64_t>(k_fit, 0)));
    }
    g.rows_per_slot_ = c.ring_rows;
  }
  if (c.slots > kMaxSize / g.rows_per_slot_ ||
      (c.draft_bytes_per_row > 0 && g.rows_per_slot_ * c.slots > INT64_MAX / c.draft_bytes_per_row)) {
    return absl::InvalidArgumentError(absl::StrFormat("draft ring: N=%d slots of %d rows (%d bytes each) overflow",
                                                      c.slots, g.rows_per_slot_, c.draft_bytes_per_row));
  }
  return g;
}

DraftRing::DraftRing(DraftRingGeometry geometry) : geometry_(std::move(geometry)) {
  slots_.resize(geometry_.config().slots);
}

absl::Status DraftRing::CheckOpen(SlotIndex slot) const {
  if (slot >= slots_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat("draft ring: slot %d out of range (N=%d)", slot, slots_.size()));
  }
  if (!slots_[slot].open) return absl::InvalidArgumentError(absl::StrFormat("draft ring: slot %d is not open", slot));
  return absl::OkStatus();
}

absl::Status DraftRing::Open(SlotIndex slot, Position start) {
  if (slot >= slots_.size() || slots_[slot].open || start < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "draft ring: cannot open slot %d at position %d (N=%d, slot %s)", slot, start, slots_.size(),
        slot < slots_.size() && slots_[slot].open ? "already open" : "free"));
  }
  slots_[slot] = SlotState{.open = true, .start = start, .frontier = start, .pending = 0};
  return absl::OkStatus();
}

absl::Status DraftRing::Close(SlotIndex slot) {
  if (absl::Status s = CheckOpen(slot); !s.ok()) return s;
  slots_[slot] = SlotState{};
  return absl::OkStatus();
}

absl::StatusOr<int64_t> DraftRing::Write(SlotIndex slot) {
  if (absl::Status s = CheckOpen(slot); !s.ok()) return s;
  SlotState& st = slots_[slot];
  if (st.pending >= geometry_.config().k_max) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "draft ring: slot %d already holds a block of K_max=%d pending positions (%d..%d); commit or roll back first",
        slot, geometry_.config().k_max, st.frontier, st.frontier + st.pending - 1));
  }
  const Position t = st.frontier + st.pending;
  ++st.pending;
  return geometry_.Row(slot, t);
}

absl::Status DraftRing::Commit(SlotIndex slot, int64_t accepted) {
  if (absl::Status s = CheckOpen(slot); !s.ok()) return s;
  SlotState& st = slots_[slot];
  if (accepted < 0 || accepted > st.pending) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "draft ring: slot %d cannot commit %d positions, %d are pending", slot, accepted, st.pending));
  }
  st.frontier += accepted;
  st.pending = 0;
  return absl::OkStatus();
}

Position DraftRing::window_begin(SlotIndex slot) const {
  const SlotState& st = slots_[slot];
  return std::max(st.start, st.frontier - geometry_.config().window);
}

absl::StatusOr<int64_t> DraftRing::ReadRow(SlotIndex slot, Position t) const {
  if (absl::Status s = CheckOpen(slot); !s.ok()) return s;
  const SlotState& st = slots_[slot];
  if (t < window_begin(slot) || t >= st.frontier + st.pending) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "draft ring: slot %d position %d is outside the live window [%d, %d)", slot, t, window_begin(slot),
        st.frontier + st.pending));
  }
  return geometry_.Row(slot, t);
}

}  // namespace dhs::spec
