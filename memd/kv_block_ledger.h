// memd/kv_block_ledger.h: what memd's KV event stream says (issue 24, "Per-tier hits and KV events"; brief §12 "KV
// event"): the decision of WHAT to publish, a pure core (no sockets, no clock). PrefixPages (memd/prefix_pages.h)
// tells it each host page that becomes confirmed (shared) or is forgotten after it was confirmed (evicted); it keeps,
// per block, how many of the block's pages are confirmed and emits, in an outbox the owner drains:
//
//   BlockStored(host)   when the last page of a block becomes confirmed (all `pages` of it are importable), and again
//                       after a removal once all are confirmed again;
//   BlockRemoved(host)  when a block announced stored loses a page (evicted): a request of that chain would no longer
//                       import the whole block;
//   AllBlocksCleared(host) once, first, when the ledger is made (memd's start: whatever an earlier memd of this node
//                       announced is void; pages it adopts from a dead memd's journal have no known chain, memd/README.md
//                       "Prefix sharing": PrefixPages feeds such a page only when a lookup hits it and tells its
//                       address, so an adopted block is announced again once all its pages were hit).
//
// A block is (tenant t, chain hash c_b, page_rows p) with b + 1 blocks of T tokens; its pages are those whose last row
// lies in it (PrefixPages::Addresses keys them on c_b): floor((b+1)T/p) - floor(bT/p) pages (T/p when p divides T). A
// block with no page of its own (T < p, a block inside one page) is never announced. A page not confirmed (writing,
// abandoned) is never counted: an announced block is always importable whole.
//
// Thread-safety: none (one owner, PrefixPages). Disabled (the stream is off): records nothing, emits nothing.
#pragma once

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "common/kv_event.h"

namespace dhs::memd {

class KvBlockLedger {
 public:
  // Enabled: the outbox starts with one AllBlocksCleared(host).
  explicit KvBlockLedger(bool enabled = false);

  // The pages of block b (0-based) of T tokens with pages of p rows: those whose last row lies in it.
  static uint32_t BlockPages(uint32_t b, uint32_t block_tokens, uint32_t page_rows);

  // One page of `block` (its tenant, block_hash, parent_hash, blocks, block_tokens, page_rows; kind and pages are
  // ignored) became confirmed / was forgotten after it had been confirmed. A block of unknown chain (blocks 0: a page
  // adopted from a journal) is ignored.
  void PageConfirmed(const KvEvent& block);
  void PageRemoved(const KvEvent& block);

  // The events since the last drain, in order.
  std::vector<KvEvent> Drain();
  bool enabled() const { return enabled_; }
  // Blocks announced stored now (gauge), and confirmed pages counted (for the checks).
  uint32_t stored_blocks() const { return stored_blocks_; }
  uint64_t confirmed_pages() const;

 private:
  using Key = std::tuple<uint64_t, uint64_t, uint32_t>;  // (tenant, block hash, page_rows)
  struct Block {
    uint32_t confirmed = 0;  // its pages confirmed now
    bool announced = false;  // the latest event of it is BlockStored
  };
  KvEvent Event(KvEventKind kind, const KvEvent& block) const;

  bool enabled_;
  std::map<Key, Block> blocks_;
  std::vector<KvEvent> outbox_;
  uint32_t stored_blocks_ = 0;
};

}  // namespace dhs::memd
