// workerd/kv/request_kv.h (internal): the per-request KV state the resolver reads and HierarchicalKvAccess owns:
// appended lengths and tail write events per source, one flat array indexed by page for the ready map (optional
// history) and the host copies (brief §4, §5), and a dense hot index of that array for the resolver.
// A page covers p positions of every source (layout.h).
//
// Hot/cold split (brief §5: the resolver's cost is bounded by B and k, never by the history): `pages` (64 bytes per
// page) is the record; the resolver's per-row lookups read only the hot index, 4 + 1 bytes per page: ready_page
// (device page of a ready-map entry, -1 = not in the ready map) and host_ready (1 = host copy completed). Writers
// change a page's copies (kv_page.h) only through Transition, and grow `pages` through GrowPages, which keep both in
// step. IndexPages extends the index over pages appended to `pages` by hand, and PlaceHostCopy / PlaceGpuCopy set a
// page's copies by hand (tests, benchmarks: states no sequence of transitions needs to reach).
//
// Thread-safety: none; owned and driven by the worker thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "common/types.h"
#include "absl/status/status.h"
#include "workerd/device/device.h"
#include "workerd/kv/kv_page.h"
#include "workerd/kv/layout.h"

namespace dhs {

struct RequestKv {
  RequestId id = 0;
  SlotIndex slot = 0;
  std::vector<Position> appended;                // rows appended per source (positions 0..appended-1)
  // Per source: one past the highest position ever written into the tail. Above `appended` after a speculative
  // round dropped rows (CommitVerified): the dropped rows took the tail slots of rows tail_end - T .. appended - T
  // - 1, which are then no longer in the tail. Empty (a state written by hand): `appended` stands for it.
  std::vector<Position> tail_end;
  std::vector<std::vector<CopyEvent>> tail_write;  // [source][t mod T]: the write of the row now in that tail slot
  std::vector<KvPage> pages;                     // by page index t / p (the record; see the hot index below)
  // Hot index, by page index, kept in step with `pages` (see the header comment).
  std::vector<int32_t> ready_page;               // pages[j].Ready() ? pages[j].device_page : -1
  std::vector<uint8_t> host_ready;               // pages[j].HostReady()
  // Residency plan (HierarchicalKvAccess::PlanResidency): host page and kept optional device page by history page,
  // -1 = none.
  std::vector<int64_t> host_plan;
  std::vector<int64_t> keep_plan;
  // Speculative round (HierarchicalKvAccess::HoldUnverified): rows at positions >= hold_from are unverified; a page
  // holding one is not completed (no backup, no kept copy) until CommitVerified. INT64_MAX: no hold.
  Position hold_from = INT64_MAX;

  // Rows of group `sources` selectable now: the smallest appended length among them.
  Position Length(std::span<const SourceId> sources) const {
    Position n = INT64_MAX;
    for (SourceId s : sources) n = std::min(n, appended[s]);
    return n;
  }
  // One past the newest row in source s's tail ring: the ring holds positions TailEnd(s) - T .. appended - 1.
  Position TailEnd(SourceId s) const { return s < tail_end.size() ? std::max(appended[s], tail_end[s]) : appended[s]; }
  // True when position t (< Length) is in the tail ring of every source of the group.
  bool InTail(std::span<const SourceId> sources, Position t, uint32_t tail_rows) const {
    for (SourceId s : sources) {
      if (t < TailEnd(s) - static_cast<Position>(tail_rows)) return false;
    }
    return true;
  }
  const KvPage* Page(Position t, uint32_t page_rows) const {
    const size_t pg = static_cast<size_t>(t / page_rows);
    return pg < pages.size() ? &pages[pg] : nullptr;
  }

  // Hot-index lookups for position t (t >= 0): the ready-map device page of its page or -1; whether its page has a
  // completed host copy. Read only the hot index.
  int32_t ReadyPage(Position t, uint32_t page_rows) const {
    const size_t pg = static_cast<size_t>(t / page_rows);
    return pg < ready_page.size() ? ready_page[pg] : -1;
  }
  bool HostReady(Position t, uint32_t page_rows) const {
    const size_t pg = static_cast<size_t>(t / page_rows);
    return pg < host_ready.size() && host_ready[pg] != 0;
  }

  // Hints the hot-index entries of position t into the cache (a first pass over a selection, so that the k lookups'
  // misses overlap instead of following one another).
  void PrefetchIndex(Position t, uint32_t page_rows) const {
    const size_t pg = static_cast<size_t>(t / page_rows);
    if (pg < ready_page.size()) {
      __builtin_prefetch(&ready_page[pg]);
      __builtin_prefetch(&host_ready[pg]);
    }
  }

  // Grows `pages` and the hot index to at least n pages (new pages: no host copy, not ready).
  void GrowPages(size_t n) {
    if (pages.size() >= n) return;
    IndexPages();
    pages.resize(n);
    ready_page.resize(n, -1);
    host_ready.resize(n, 0);
  }
  // Moves the host copy of `page` (TransitionPage, kv_page.h) and keeps the hot index in step. Errors: TransitionPage's
  // (FAILED_PRECONDITION; nothing changed).
  absl::Status Transition(uint32_t page, HostCopy from, HostCopy to) {
    if (absl::Status s = TransitionPage(pages[page], from, to); !s.ok()) return s;
    host_ready[page] = pages[page].HostReady() ? 1 : 0;
    return absl::OkStatus();
  }
  // Moves the GPU copy of `page` (its device_page set first for kFilling) and keeps the hot index in step.
  absl::Status Transition(uint32_t page, GpuCopy from, GpuCopy to) {
    if (absl::Status s = TransitionPage(pages[page], from, to); !s.ok()) return s;
    ready_page[page] = pages[page].Ready() ? static_cast<int32_t>(pages[page].device_page) : -1;
    return absl::OkStatus();
  }
  // A state built by hand (tests, benchmarks; HierarchicalKvAccess never calls these): sets the page's host (GPU) copy
  // and its host (device) page without the table's check, and indexes the page (`page` < pages.size()).
  void PlaceHostCopy(uint32_t page, HostCopy state, int64_t host_page) {
    IndexPages();
    pages[page].host = state;
    pages[page].host_page = host_page;
    host_ready[page] = pages[page].HostReady() ? 1 : 0;
  }
  void PlaceGpuCopy(uint32_t page, GpuCopy state, int64_t device_page) {
    IndexPages();
    pages[page].gpu = state;
    pages[page].device_page = device_page;
    ready_page[page] = pages[page].Ready() ? static_cast<int32_t>(device_page) : -1;
  }
  // Extends the hot index over pages added to `pages` directly (O(1) when in step).
  void IndexPages() {
    for (size_t j = ready_page.size(); j < pages.size(); ++j) {
      ready_page.push_back(pages[j].Ready() ? static_cast<int32_t>(pages[j].device_page) : -1);
    }
    for (size_t j = host_ready.size(); j < pages.size(); ++j) host_ready.push_back(pages[j].HostReady() ? 1 : 0);
  }
};

}  // namespace dhs
