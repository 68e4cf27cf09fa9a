// workerd/kv/hot_cache.h (internal): the hot cache of one (request, group): B slots with LRU replacement (brief §5).
// A position->slot map of at most B entries (an open-addressing table of slot indices, keyed by the slot's position,
// with linear probing and backward-shift deletion, at most half full: no allocation after construction; each slot
// knows its entry, so evicting a slot's old row needs no probe) plus an intrusive LRU list; every operation is O(1)
// except Victim and Claim, which walk from the LRU end past protected slots (at most k of them). Slots selected in
// the current step are protected (their stamp equals the step's). Initial LRU order: slot 0 is least recent. An
// invalidated slot becomes the least recent.
//
// Thread-safety: none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/types.h"

namespace dhs {

class HotCache {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;
  explicit HotCache(uint32_t slots);

  uint32_t size() const { return static_cast<uint32_t>(pos_.size()); }
  void Reset();
  uint32_t Find(Position t) const;               // slot or kNone
  // A hint that Find(t) or a claim of t follows soon: loads t's home entry of the map (no effect on the state).
  void Prefetch(Position t) const { __builtin_prefetch(&map_[Home(t)]); }
  void Touch(uint32_t h, uint64_t step);         // most recent + protected in `step`
  uint32_t Victim(uint64_t step) const;          // least recent unprotected slot, or kNone
  // A missing row t in `step` (Find, then ClaimAbsent): the slot already holding t (a duplicate claimed earlier in
  // the step; *assigned = false, nothing changes), else the least recent unprotected slot, now holding t, most recent
  // and protected (*assigned = true); kNone when every slot is protected (nothing changes).
  uint32_t Claim(Position t, uint64_t step, bool* assigned);
  // Claim of a row known to be absent (Find(t) == kNone since the last change): the least recent unprotected slot,
  // now holding t, most recent and protected; kNone when every slot is protected (nothing changes). Saves Claim's
  // Find (the fused resolver's misses were looked up by its hot-hit pass).
  uint32_t ClaimAbsent(Position t, uint64_t step);
  void Invalidate(uint32_t h);                   // empty, least recent
  Position PositionAt(uint32_t h) const { return pos_[h]; }

 private:
  void Unlink(uint32_t h);
  void PushFront(uint32_t h);  // most recent
  void PushBack(uint32_t h);   // least recent

  // The position->slot table holds slot indices (kNone = empty); an entry's key is pos_ of its slot. 4 bytes per
  // entry keep the table small enough to stay in cache beside the rows a step copies.
  size_t Home(Position t) const {
    return static_cast<size_t>((static_cast<uint64_t>(t) * 0x9E3779B97F4A7C15ULL) >> shift_);
  }
  size_t Probe(Position t) const;  // index of t's entry, or of the empty entry where t would go
  void MapInsert(Position t, uint32_t h);  // t absent: slot h (pos_[h] = t afterwards) enters the table
  void MapErase(uint32_t h);               // slot h (mapped) leaves the table

  std::vector<uint32_t> map_;  // power-of-two size >= 2 * (B + 1)
  uint32_t shift_ = 64;
  std::vector<uint32_t> entry_;  // [B] index of the slot's table entry, kNone when it holds no row
  std::vector<Position> pos_;
  std::vector<uint64_t> stamp_;
  std::vector<uint32_t> prev_, next_;
  uint32_t head_ = kNone, tail_ = kNone;  // head: most recent; tail: least recent
};

}  // namespace dhs
