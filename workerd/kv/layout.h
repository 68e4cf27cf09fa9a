// workerd/kv/layout.h: the worker's KV configuration and the byte layout of its KV pool (brief §2, §5, §8).
//
// One device pool holds, in order:
//   - per request slot i, per source s: the hot cache (B rows) then the tail (T rows, a ring: position t at t mod T);
//   - the optional-history pages (page indices granted by memd). A page covers p positions of EVERY source: inside a
//     page, source s owns p consecutive rows at p * (sum of row bytes of sources before s).
// Host pages (host_page_bytes() bytes each) start with the same page layout (page_bytes() bytes), so a page copies
// host<->device source by source, FOLLOWED by the page's index keys (resume from host KV, issue 11; an extension of
// brief §8, whose index keys otherwise live on GPU only): indexer i owns p consecutive keys of key_bytes[i] bytes at
// page_bytes() + p * (sum of key bytes of indexers before i). Key regions are written by the worker as keys are
// computed (HierarchicalKvAccess::StoreIndexKeys) and never copied to a device page.
// Every source reads only its own rows even though all sources share one pool allocation.
// Groups: an index producer's followers form one group (one shared position->slot plan, separate bytes per source);
// a shared-source model has groups of one source. The group is the unit of planning.
//
// Thread-safety: immutable after Create; safe to share.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/types.h"

namespace dhs {

struct KvConfig {
  std::vector<uint64_t> row_bytes;            // d_KV bytes per row, indexed by SourceId (sources 0..S-1)
  std::vector<std::vector<SourceId>> groups;  // every source in exactly one group
  uint32_t page_rows = 64;                    // p
  uint32_t hot_rows = 0;                      // B, per request slot and source
  uint32_t k = 0;                             // selection width; B >= k is required
  uint32_t tail_rows = 0;                     // T per request slot and source; a multiple of p, >= p
  uint32_t slots = 1;                         // N request slots
  uint32_t optional_pages = 0;                // device pages for optional history
  std::vector<uint64_t> key_bytes;            // index key bytes per position, per indexer (idx_dim * 4); may be empty
  // Staging arenas of speculative verification (brief §6 "Staging"; HierarchicalKvAccess): χ arenas of K_max * k
  // rows per request slot, in their own device pool. 0 arenas: none (a round's union must then fit the hot cache).
  uint32_t staging_arenas = 0;                // χ
  uint32_t staging_k_max = 0;                 // K_max queries per round (>= 1 with arenas)
};

class KvLayout {
 public:
  // Errors: INVALID_ARGUMENT with the reason (B < k, T not a positive multiple of p, bad groups, zero sizes).
  static absl::StatusOr<KvLayout> Create(const KvConfig& config);

  const KvConfig& config() const { return config_; }
  uint32_t num_sources() const { return static_cast<uint32_t>(config_.row_bytes.size()); }
  uint32_t group_of(SourceId s) const { return group_of_[s]; }
  uint64_t row_bytes(SourceId s) const { return config_.row_bytes[s]; }
  uint64_t page_bytes() const { return page_bytes_; }  // p * sum of row bytes (a device page)
  // A host page: page_bytes() + p * sum of key bytes (the payload, then the index keys).
  uint64_t host_page_bytes() const { return host_page_bytes_; }
  uint32_t num_indexers() const { return static_cast<uint32_t>(config_.key_bytes.size()); }
  // Byte offset of the index key of row `row` of indexer i inside a host page.
  uint64_t KeyInPage(uint32_t indexer, uint32_t row) const {
    return page_bytes_ + config_.page_rows * key_src_[indexer] + row * config_.key_bytes[indexer];
  }
  uint64_t pool_bytes() const { return pages_base_ + page_bytes_ * config_.optional_pages; }

  // Byte offsets in the KV pool. Arguments are not range-checked (callers validate).
  Location HotRow(SlotIndex slot, SourceId s, uint32_t hot_slot) const {
    return static_cast<Location>(slot * slot_bytes_ + slot_src_[s] + uint64_t{hot_slot} * row_bytes(s));
  }
  Location TailRow(SlotIndex slot, SourceId s, Position t) const {
    return static_cast<Location>(slot * slot_bytes_ + slot_src_[s] +
                                 (config_.hot_rows + static_cast<uint64_t>(t) % config_.tail_rows) * row_bytes(s));
  }
  Location PageRow(PageIndex page, SourceId s, uint32_t row) const {
    return static_cast<Location>(pages_base_ + page * page_bytes_ + InPage(s, row));
  }
  // Byte offset of row `row` of source s inside a page (device or host page).
  uint64_t InPage(SourceId s, uint32_t row) const { return config_.page_rows * page_src_[s] + row * row_bytes(s); }

 private:
  KvConfig config_;
  std::vector<uint32_t> group_of_;
  std::vector<uint64_t> slot_src_;  // offset of source s inside a slot's region
  std::vector<uint64_t> page_src_;  // sum of row bytes of sources before s
  std::vector<uint64_t> key_src_;   // sum of key bytes of indexers before i
  uint64_t host_page_bytes_ = 0;
  uint64_t slot_bytes_ = 0;
  uint64_t page_bytes_ = 0;
  uint64_t pages_base_ = 0;
};

}  // namespace dhs
