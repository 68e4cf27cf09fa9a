// workerd/prefix_cache.cc: see prefix_cache.h.
#include "workerd/prefix_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/prompt_tokens.h"

namespace dhs {

uint64_t PrefixBlock::bytes() const {
  uint64_t n = 0;
  for (const auto& r : rows) n += r.size();
  for (const auto& k : keys) n += k.size() * sizeof(float);
  return n;
}

uint64_t PrefixRowCache::Digest(std::span<const uint64_t> chain, uint32_t block_tokens, std::string_view tenant) {
  uint64_t h = SplitMix64(block_tokens);
  for (char ch : tenant) h = SplitMix64(h ^ static_cast<uint8_t>(ch));
  for (uint64_t id : chain) h = SplitMix64(h ^ SplitMix64(id));
  return h;
}

PrefixRowCache::Lru::iterator PrefixRowCache::Lookup(std::span<const uint64_t> chain, uint32_t block_tokens,
                                                     std::string_view tenant) {
  auto it = by_digest_.find(Digest(chain, block_tokens, tenant));
  if (it == by_digest_.end()) return lru_.end();
  for (Lru::iterator e : it->second) {
    if (e->block_tokens == block_tokens && e->tenant == tenant && std::equal(e->chain.begin(), e->chain.end(), chain.begin(), chain.end())) {
      return e;
    }
  }
  return lru_.end();
}

const PrefixBlock* PrefixRowCache::Find(std::span<const uint64_t> chain, uint32_t block_tokens,
                                         std::string_view tenant) {
  Lru::iterator e = Lookup(chain, block_tokens, tenant);
  if (e == lru_.end()) {
    ++stats_.misses;
    return nullptr;
  }
  ++stats_.hits;
  lru_.splice(lru_.begin(), lru_, e);  // iterators stay valid
  return &e->block;
}

const PrefixBlock* PrefixRowCache::Peek(std::span<const uint64_t> chain, uint32_t block_tokens,
                                         std::string_view tenant) {
  Lru::iterator e = Lookup(chain, block_tokens, tenant);
  return e == lru_.end() ? nullptr : &e->block;
}

bool PrefixRowCache::Insert(std::span<const uint64_t> chain, uint32_t block_tokens, PrefixBlock block,
                            std::string_view tenant) {
  const uint64_t size = block.bytes();
  if (size > capacity_bytes_ || chain.empty() || Lookup(chain, block_tokens, tenant) != lru_.end()) return false;
  while (stats_.bytes + size > capacity_bytes_ && !lru_.empty()) {
    Entry& victim = lru_.back();
    auto bucket = by_digest_.find(victim.digest);
    bucket->second.erase(std::find(bucket->second.begin(), bucket->second.end(), std::prev(lru_.end())));
    if (bucket->second.empty()) by_digest_.erase(bucket);
    stats_.bytes -= victim.block.bytes();
    --stats_.blocks;
    ++stats_.evicted;
    lru_.pop_back();
  }
  const uint64_t digest = Digest(chain, block_tokens, tenant);
  lru_.push_front(Entry{std::vector<uint64_t>(chain.begin(), chain.end()), block_tokens, std::string(tenant), digest,
                        std::move(block)});
  by_digest_[digest].push_back(lru_.begin());
  stats_.bytes += size;
  ++stats_.blocks;
  ++stats_.inserted;
  return true;
}

absl::Status RowCapture::Append(RequestId request, SourceId source, Position position, std::span<const uint8_t> row) {
  absl::Status s = inner_->Append(request, source, position, row);
  if (s.ok() && request == request_) {
    if (source >= block_->rows.size()) {
      return absl::InternalError(absl::StrCat("prefix capture: source ", source, " outside ", block_->rows.size()));
    }
    block_->rows[source].insert(block_->rows[source].end(), row.begin(), row.end());
  }
  return s;
}

}  // namespace dhs
