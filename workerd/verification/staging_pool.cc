#include "workerd/verification/staging_pool.h"

#include "absl/strings/str_format.h"

namespace dhs::spec {

absl::StatusOr<int64_t> StagingReservationBytes(const StagingShape& s) {
  const int64_t factors[] = {s.arenas, s.slots, s.k_max, s.k, s.row_bytes};
  int64_t bytes = 1;
  for (int64_t f : factors) {
    if (f < 1 || bytes > INT64_MAX / f) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "staging reservation χ * N * K_max * k * d_KV = %d * %d * %d * %d * %d: every factor must be >= 1 and the "
          "product below 2^63", s.arenas, s.slots, s.k_max, s.k, s.row_bytes));
    }
    bytes *= f;
  }
  return bytes;
}

int64_t StagingRowOffset(const StagingShape& s, uint32_t arena, uint32_t slot, int64_t row) {
  return ((static_cast<int64_t>(arena) * s.slots + slot) * s.k_max * s.k + row) * s.row_bytes;
}

StagingArenaPool::StagingArenaPool(uint32_t arenas) : arenas_(arenas) {}

uint32_t StagingArenaPool::free_arenas() const {
  uint32_t n = 0;
  for (const Arena& a : arenas_) n += a.readers == 0;
  return n;
}

absl::StatusOr<uint32_t> StagingArenaPool::Acquire(uint32_t group, uint32_t source, uint32_t readers) {
  if (readers == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("staging: group %d source %d acquires an arena with no readers", group, source));
  }
  uint32_t pick = UINT32_MAX;
  for (uint32_t a = 0; a < arenas_.size(); ++a) {
    if (arenas_[a].readers > 0 && arenas_[a].group == group && arenas_[a].source == source) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "staging: group %d source %d already holds arena %d (%d readers outstanding)", group, source, a,
          arenas_[a].readers));
    }
    if (arenas_[a].readers == 0 && pick == UINT32_MAX) pick = a;
  }
  if (pick == UINT32_MAX) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "staging: all χ=%d arenas have readers; group %d source %d waits for the previous group", arenas_.size(),
        group, source));
  }
  arenas_[pick] = Arena{readers, group, source};
  return pick;
}

absl::StatusOr<bool> StagingArenaPool::ReleaseReader(uint32_t arena) {
  if (arena >= arenas_.size() || arenas_[arena].readers == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "staging: release of arena %d, which %s", arena,
        arena >= arenas_.size() ? absl::StrFormat("does not exist (χ=%d)", arenas_.size()) : "has no readers"));
  }
  return --arenas_[arena].readers == 0;
}

}  // namespace dhs::spec
