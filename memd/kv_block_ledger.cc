#include "memd/kv_block_ledger.h"

#include <utility>

namespace dhs::memd {

KvBlockLedger::KvBlockLedger(bool enabled) : enabled_(enabled) {
  if (enabled_) outbox_.push_back(KvEvent{KvEventKind::kAllBlocksCleared, KvMedium::kHost});
}

uint32_t KvBlockLedger::BlockPages(uint32_t b, uint32_t block_tokens, uint32_t page_rows) {
  if (block_tokens == 0 || page_rows == 0) return 0;
  const uint64_t end = (uint64_t{b} + 1) * block_tokens / page_rows;  // pages whose last row is before (b+1)T
  const uint64_t begin = uint64_t{b} * block_tokens / page_rows;
  return static_cast<uint32_t>(end - begin);
}

KvEvent KvBlockLedger::Event(KvEventKind kind, const KvEvent& block) const {
  KvEvent e = block;
  e.kind = kind;
  e.medium = KvMedium::kHost;
  e.pages = BlockPages(block.blocks - 1, block.block_tokens, block.page_rows);
  return e;
}

void KvBlockLedger::PageConfirmed(const KvEvent& block) {
  if (!enabled_ || block.blocks == 0) return;
  const uint32_t pages = BlockPages(block.blocks - 1, block.block_tokens, block.page_rows);
  Block& b = blocks_[Key{block.tenant, block.block_hash, block.page_rows}];
  ++b.confirmed;
  if (!b.announced && pages > 0 && b.confirmed >= pages) {
    b.announced = true;
    ++stored_blocks_;
    outbox_.push_back(Event(KvEventKind::kBlockStored, block));
  }
}

void KvBlockLedger::PageRemoved(const KvEvent& block) {
  if (!enabled_ || block.blocks == 0) return;
  auto it = blocks_.find(Key{block.tenant, block.block_hash, block.page_rows});
  if (it == blocks_.end() || it->second.confirmed == 0) return;  // never counted (cannot happen: PrefixPages pairs them)
  Block& b = it->second;
  --b.confirmed;
  if (b.announced) {
    b.announced = false;
    --stored_blocks_;
    outbox_.push_back(Event(KvEventKind::kBlockRemoved, block));
  }
  if (b.confirmed == 0) blocks_.erase(it);
}

std::vector<KvEvent> KvBlockLedger::Drain() { return std::exchange(outbox_, {}); }

uint64_t KvBlockLedger::confirmed_pages() const {
  uint64_t n = 0;
  for (const auto& [key, b] : blocks_) n += b.confirmed;
  return n;
}

}  // namespace dhs::memd
