// workerd/kv/hot_cache.cc: see hot_cache.h.
#include "workerd/kv/hot_cache.h"

namespace dhs {

HotCache::HotCache(uint32_t slots) : pos_(slots), stamp_(slots), prev_(slots), next_(slots) {
  map_.reserve(size_t{slots} + 1);  // Claim inserts before it erases the victim's old row
  Reset();
}

void HotCache::Reset() {
  map_.clear();
  head_ = tail_ = kNone;
  for (uint32_t h = 0; h < size(); ++h) {
    pos_[h] = kNoPosition;
    stamp_[h] = 0;
    PushFront(h);  // slot 0 ends up least recent
  }
}

uint32_t HotCache::Find(Position t) const {
  auto it = map_.find(t);
  return it == map_.end() ? kNone : it->second;
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
  auto [it, inserted] = map_.try_emplace(t, kNone);
  if (!inserted) return it->second;
  const uint32_t h = Victim(step);
  if (h == kNone) {
    map_.erase(it);
    return kNone;
  }
  it->second = h;
  if (pos_[h] != kNoPosition) map_.erase(pos_[h]);  // another key: `it` is not used after this
  pos_[h] = t;
  Touch(h, step);
  *assigned = true;
  return h;
}

void HotCache::Invalidate(uint32_t h) {
  if (pos_[h] != kNoPosition) map_.erase(pos_[h]);
  pos_[h] = kNoPosition;
  stamp_[h] = 0;
  Unlink(h);
  PushBack(h);
}

}  // namespace dhs
