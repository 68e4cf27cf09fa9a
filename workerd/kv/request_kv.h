// workerd/kv/request_kv.h (internal): the per-request KV state the resolver reads and HierarchicalKvAccess owns:
// appended lengths and tail write events per source, and one flat array indexed by page for the ready map (optional
// history) and the host copies (brief §4, §5). A page covers p positions of every source (layout.h).
//
// Thread-safety: none; owned and driven by the worker thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "common/types.h"
#include "workerd/device/device.h"
#include "workerd/kv/layout.h"

namespace dhs {

struct KvPage {
  // Host copy: host_page >= 0 once a backup was issued; host_ready once its copy completed (brief §4).
  int64_t host_page = -1;
  bool host_ready = false;
  CopyEvent backup;
  // Optional history: device_page >= 0 while populating or ready; `ready` (the ready map entry) is set only after
  // the populate copy completed, and cleared by a withdrawal before the page is retired.
  int64_t device_page = -1;
  bool ready = false;
  CopyEvent populate;
};

struct RequestKv {
  RequestId id = 0;
  SlotIndex slot = 0;
  std::vector<Position> appended;                // rows appended per source (positions 0..appended-1)
  std::vector<std::vector<CopyEvent>> tail_write;  // [source][t mod T]: the write of the row now in that tail slot
  std::vector<KvPage> pages;                     // by page index t / p
  // Residency plan (HierarchicalKvAccess::PlanResidency): host page and kept optional device page by history page,
  // -1 = none.
  std::vector<int64_t> host_plan;
  std::vector<int64_t> keep_plan;

  // Rows of group `sources` selectable now: the smallest appended length among them.
  Position Length(std::span<const SourceId> sources) const {
    Position n = INT64_MAX;
    for (SourceId s : sources) n = std::min(n, appended[s]);
    return n;
  }
  // True when position t (< Length) is in the tail ring of every source of the group.
  bool InTail(std::span<const SourceId> sources, Position t, uint32_t tail_rows) const {
    for (SourceId s : sources) {
      if (t < appended[s] - static_cast<Position>(tail_rows)) return false;
    }
    return true;
  }
  const KvPage* Page(Position t, uint32_t page_rows) const {
    const size_t pg = static_cast<size_t>(t / page_rows);
    return pg < pages.size() ? &pages[pg] : nullptr;
  }
};

}  // namespace dhs
