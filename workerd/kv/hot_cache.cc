// workerd/kv/hot_cache.cc: see hot_cache.h.
#include "workerd/kv/hot_cache.h"

#include <algorithm>

namespace dhs {

HotCache::HotCache(uint32_t slots)
    : entry_(slots), pos_(slots), stamp_(slots), prev_(slots), next_(slots) {
  size_t cap = 16;
  while (cap < 2 * (size_t{slots} + 1)) cap <<= 1;
  map_.resize(cap);
  shift_ = static_cast<uint32_t>(64 - __builtin_ctzll(cap));
  Reset();
}

size_t HotCache::Probe(Position t) const {
  const size_t mask = map_.size() - 1;
  size_t i = Home(t);
  while (map_[i] != kNone && pos_[map_[i]] != t) i = (i + 1) & mask;
  return i;
}

void HotCache::MapInsert(Position t, uint32_t h) {
  const size_t i = Probe(t);
  map_[i] = h;
  entry_[h] = static_cast<uint32_t>(i);
}

void HotCache::MapErase(uint32_t h) {
  const size_t mask = map_.size() - 1;
  size_t i = entry_[h];
  entry_[h] = kNone;
  // Backward-shift deletion: move later entries of the cluster into the hole when their home allows it.
  for (size_t j = (i + 1) & mask;; j = (j + 1) & mask) {
    const uint32_t e = map_[j];
    if (e == kNone) break;
    const size_t home = Home(pos_[e]);
    // j's entry may fill the hole at i unless its home lies cyclically in (i, j].
    if (((j - home) & mask) >= ((j - i) & mask)) {
      map_[i] = e;
      entry_[e] = static_cast<uint32_t>(i);
      i = j;
    }
  }
  map_[i] = kNone;
}

void HotCache::Reset() {
  std::fill(map_.begin(), map_.end(), kNone);
  head_ = tail_ = kNone;
  for (uint32_t h = 0; h < size(); ++h) {
    entry_[h] = kNone;
    pos_[h] = kNoPosition;
    stamp_[h] = 0;
    PushFront(h);  // slot 0 ends up least recent
  }
}

uint32_t HotCache::Find(Position t) const {
  return map_[Probe(t)];  // kNone in an empty entry
}

void HotCache::Unlink(uint32_t h) {
  if (prev_[h] != kNone) next_[prev_[h]] = next_[h]; else head_ = next_[h];
  if (next_[h] != kNone) prev_[next_[h]] = prev_[h]; else tail_ = prev_[h];
}

void HotCache::PushFront(uint32_t h) {
  prev_[h] = kNone;
  next_[h] = head_;
  if (head_ != kNone) prev_[head_] = h; else tail_ = h;
  head_ = h;
}

void HotCache::PushBack(uint32_t h) {
  next_[h] = kNone;
  prev_[h] = tail_;
  if (tail_ != kNone) next_[tail_] = h; else head_ = h;
  tail_ = h;
}

void HotCache::Touch(uint32_t h, uint64_t step) {
  stamp_[h] = step;
  Unlink(h);
  PushFront(h);
}

uint32_t HotCache::Victim(uint64_t step) const {
  for (uint32_t h = tail_; h != kNone; h = prev_[h]) {
    if (stamp_[h] != step) return h;
  }
  return kNone;
}

uint32_t HotCache::Claim(Position t, uint64_t step, bool* assigned) {
  *assigned = false;
  const uint32_t found = Find(t);
  if (found != kNone) return found;
  const uint32_t h = ClaimAbsent(t, step);
  *assigned = h != kNone;
  return h;
}

uint32_t HotCache::ClaimAbsent(Position t, uint64_t step) {
  const uint32_t h = Victim(step);
  if (h == kNone) return kNone;
  if (pos_[h] != kNoPosition) MapErase(h);
  pos_[h] = t;
  MapInsert(t, h);
  Touch(h, step);
  return h;
}

void HotCache::Invalidate(uint32_t h) {
  if (pos_[h] != kNoPosition) MapErase(h);
  pos_[h] = kNoPosition;
  stamp_[h] = 0;
  Unlink(h);
  PushBack(h);
}

}  // namespace dhs
