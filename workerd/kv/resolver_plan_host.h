// workerd/kv/resolver_plan_host.h: host-side owners of the plain views that resolver_plan.h works on: the geometry of
// one group (from a KvLayout), the hot caches of a set of slots, a request's flattened state, and RunPlanHost, the
// batch loop with HostLanes (the host compilation of the device kernel's code).
//
// Thread-safety: none.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "workerd/kv/layout.h"
#include "workerd/kv/request_kv.h"
#include "workerd/kv/resolver_plan.h"

namespace dhs::plan {

// The Geometry of `sources` (one group, in batch order) in `layout`, with its arrays.
struct GeometryStorage {
  std::vector<uint64_t> slot_src, in_page, row_bytes;
  Geometry g;

  GeometryStorage(const KvLayout& layout, std::span<const SourceId> sources) {
    const KvConfig& c = layout.config();
    for (SourceId s : sources) {
      slot_src.push_back(static_cast<uint64_t>(layout.HotRow(0, s, 0)));
      in_page.push_back(layout.InPage(s, 0));
      row_bytes.push_back(layout.row_bytes(s));
    }
    g.hot_rows = c.hot_rows;
    g.tail_rows = c.tail_rows;
    g.page_rows = c.page_rows;
    g.num_sources = static_cast<uint32_t>(sources.size());
    // Public offsets only: a slot's region is the distance between slots 0 and 1 of any source; pages start at
    // PageRow(0, s, 0) - InPage(s, 0).
    g.slot_bytes = static_cast<uint64_t>(layout.HotRow(1, 0, 0) - layout.HotRow(0, 0, 0));
    g.pages_base = static_cast<uint64_t>(layout.PageRow(0, 0, 0)) - layout.InPage(0, 0);
    g.page_bytes = layout.page_bytes();
    g.host_page_bytes = layout.host_page_bytes();
    g.slot_src = slot_src.data();
    g.in_page = in_page.data();
    g.row_bytes = row_bytes.data();
  }
  GeometryStorage(const GeometryStorage&) = delete;
  GeometryStorage& operator=(const GeometryStorage&) = delete;
};

// The hot caches of `slots` request slots of one group (B slots each), laid out slot after slot. Initial state as
// HotCache: empty, slot 0 least recent.
struct HotSlotsStorage {
  uint32_t b = 0;
  std::vector<int64_t> pos, last_use, clock;
  std::vector<uint64_t> stamp;

  HotSlotsStorage(uint32_t slots, uint32_t hot_rows) : b(hot_rows) {
    pos.assign(size_t{slots} * b, kNone);
    stamp.assign(size_t{slots} * b, 0);
    clock.assign(slots, 0);
    last_use.resize(size_t{slots} * b);
    for (uint32_t i = 0; i < slots; ++i) ResetSlot(i);
  }
  void ResetSlot(uint32_t slot) {
    for (uint32_t h = 0; h < b; ++h) {
      pos[size_t{slot} * b + h] = kNone;
      stamp[size_t{slot} * b + h] = 0;
      last_use[size_t{slot} * b + h] = static_cast<int64_t>(h) - static_cast<int64_t>(b);
    }
    clock[slot] = 0;
  }
  HotSlots View(uint32_t slot) {
    return HotSlots{pos.data() + size_t{slot} * b, last_use.data() + size_t{slot} * b,
                    stamp.data() + size_t{slot} * b, clock.data() + slot};
  }
};

// host_page by history page of `kv` (the flat array the plan reads; RequestKv keeps it inside its page records).
inline std::vector<int64_t> HostPages(const RequestKv& kv) {
  std::vector<int64_t> v(kv.pages.size());
  for (size_t j = 0; j < kv.pages.size(); ++j) v[j] = kv.pages[j].host_page;
  return v;
}

// A Query over `kv` for group `group_sources`: its hot index in place, host_pages from HostPages(kv).
inline Query MakeQuery(const RequestKv& kv, std::span<const SourceId> group_sources, uint32_t tail_rows,
                       const std::vector<int64_t>& host_pages, std::span<const Position> selection,
                       std::span<Location> out, HotSlots cache) {
  Query q;
  q.slot = kv.slot;
  int64_t hi = INT64_MIN;
  for (SourceId s : group_sources) hi = kv.TailEnd(s) > hi ? kv.TailEnd(s) : hi;
  q.tail_low = hi - static_cast<int64_t>(tail_rows);
  q.pages = std::min<uint64_t>({kv.ready_page.size(), kv.host_ready.size(), host_pages.size()});
  q.ready_page = kv.ready_page.data();
  q.host_ready = kv.host_ready.data();
  q.host_page = host_pages.data();
  q.selection = selection.data();
  q.k = static_cast<uint32_t>(selection.size());
  q.out = out.data();
  q.cache = cache;
  return q;
}

// Runs the plan and gather of every query on the host, one query after another (HostLanes), with step number
// `step` (> 0, one per batch). results[i] is overwritten. Returns the first error code, kOk when none.
inline int32_t RunPlanHost(const Geometry& g, std::span<const Query> queries, uint64_t step,
                           std::span<QueryResult> results, const uint8_t* host_pool, uint8_t* device_pool) {
  std::vector<uint64_t> scratch;
  int32_t first_error = kOk;
  for (size_t i = 0; i < queries.size(); ++i) {
    scratch.assign((ScratchBytes(queries[i].k, g.hot_rows) + 7) / 8, 0);
    const Scratch s = CarveScratch(scratch.data(), queries[i].k, g.hot_rows);
    results[i] = QueryResult{};
    PlanAndGather(HostLanes{}, g, queries[i], step, s, &results[i], host_pool, device_pool);
    if (first_error == kOk) first_error = results[i].error;
  }
  return first_error;
}

}  // namespace dhs::plan
