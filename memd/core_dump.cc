#include "memd/core_dump.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

namespace dhs::memd::core {

namespace {

// Page rows of `t` for the `pages` view: at most scope.page_count pages from scope.page_from, or as many maximal runs
// of one state and owner (the scan stops at the page that would start one run too many, or at M).
void FillPageRows(const GpuPageTable& t, const DumpScope& scope, GpuDump& gd) {
  gd.page_from = scope.page_from;
  const PageIndex m = t.pages();
  if (!scope.page_runs) {
    const PageIndex end = scope.page_from >= m ? m : scope.page_from + std::min(scope.page_count, m - scope.page_from);
    for (PageIndex p = scope.page_from; p < end; ++p) {
      gd.page_states.push_back(t.state(p));
      gd.page_owners.push_back(t.owner(p));
    }
    return;
  }
  for (PageIndex p = scope.page_from; p < m; ++p) {
    PageRun* last = gd.page_runs.empty() ? nullptr : &gd.page_runs.back();
    if (last && last->state == t.state(p) && last->owner == t.owner(p)) {
      ++last->count;
      continue;
    }
    if (gd.page_runs.size() == scope.page_count) break;
    gd.page_runs.push_back(PageRun{p, 1, t.state(p), t.owner(p)});
  }
}

// The reclaim rank of every request in `requests`: its place in the policy's order of its GPU's candidates (only the
// GPUs those requests are on are ordered).
void AddReclaimRanks(const State& s, const ReclaimPolicy& policy, std::vector<RequestDump>& requests) {
  std::set<GpuId> gpus;
  for (const RequestDump& rd : requests) gpus.insert(rd.gpu);
  std::map<RequestId, int32_t> rank;
  for (GpuId gid : gpus) {
    std::vector<ReclaimCandidate> c = VictimCandidates(s, gid, false);
    policy.Order(c);
    for (size_t i = 0; i < c.size(); ++i) rank[c[i].request] = static_cast<int32_t>(i);
  }
  for (RequestDump& rd : requests) {
    auto it = rank.find(rd.request);
    rd.reclaim_rank = it == rank.end() ? -1 : it->second;
  }
}

RequestDump RequestDumpOf(const Request& r) {  // reclaim_rank left at -1 (AddReclaimRanks)
  RequestDump rd;
  rd.request = r.id;
  rd.gpu = r.gpu;
  rd.slot = r.slot;
  rd.state = r.state;
  rd.required_pages = r.state == RequestState::kQueued ? r.required_count : static_cast<uint32_t>(r.required.size());
  rd.optional_pages = r.optional;
  rd.history_pages = static_cast<uint32_t>(r.state == RequestState::kQueued ? r.imported_pages : r.history.size());
  for (uint32_t j = 0; j < r.history.size(); ++j) {
    const HistoryPage& hp = r.history[j];
    // A host copy, or covered by the worker's tail until written (kLost: neither, the request was interrupted).
    rd.host_pages += hp.state != HistoryState::kGpu && hp.state != HistoryState::kLost;
    rd.tail_pages += hp.state == HistoryState::kHostPending || hp.state == HistoryState::kGpuDeferred;
    const bool confirmed = hp.state == HistoryState::kHost || hp.state == HistoryState::kPopulating ||
                           hp.state == HistoryState::kGpuAndHost;
    if (confirmed) rd.host_copies.emplace_back(j, hp.host_page);
  }
  rd.host_pages += static_cast<uint32_t>(r.resumed_host.size());  // a queued resume's taken-over host copies
  rd.admitted_at_us = r.time_us;
  rd.draft_ring_pages = r.speculation.draft_ring_pages;
  rd.staging_pages = r.speculation.staging_pages;
  rd.draft_ring_bytes = r.speculation.draft_ring_bytes;
  rd.staging_bytes = r.speculation.staging_bytes;
  return rd;
}

}  // namespace

StateDump DumpOf(const State& s, const ReclaimPolicy& policy, const PrefixSharing& prefix, const DumpScope& scope) {
  StateDump d;
  d.policy = std::string(policy.name());
  d.now_us = s.clock();
  d.request_count = s.requests.size();
  for (const auto& [gid, g] : s.gpus) {
    GpuDump gd;
    const GpuPageTable& t = g.table;
    gd.gpu = gid;
    gd.epoch = s.epochs.at(gid);
    gd.pages = t.pages();
    gd.required_pages = t.required();
    gd.optional_pages = t.optional();
    gd.reserve_pages = t.reserve();
    gd.free_pages = t.free();
    gd.pending_pages = t.optional_pending();
    gd.ready_pages = t.optional_ready();
    gd.reclaiming_pages = t.reclaiming();
    gd.queue.assign(g.queue.begin(), g.queue.end());
    for (const auto& [rid, rc] : s.reclaims) gd.reclaims_in_flight += rc.gpu == gid;
    gd.reclaimable_pages = static_cast<uint32_t>(g.victims.total_pages());
    gd.request_slots = g.request_slots;
    gd.used_slots = static_cast<uint32_t>(g.used_slots.size());
    gd.declared_draft_ring_bytes = g.declared.draft_ring_bytes;
    gd.declared_staging_bytes = g.declared.staging_bytes;
    gd.draft_ring_pages = g.speculation.draft_ring_pages;
    gd.staging_pages = g.speculation.staging_pages;
    gd.draft_ring_bytes = g.speculation.draft_ring_bytes;
    gd.staging_bytes = g.speculation.staging_bytes;
    for (RequestId q : g.queue) {
      const Request& r = s.requests.at(q);
      gd.queued_required_pages += r.required_count;
      gd.queued_host_pages += r.context_pages - static_cast<uint32_t>(r.resumed_host.size());  // a resume owns some
    }
    if (scope.page_gpu == gid) FillPageRows(t, scope, gd);
    d.gpus.push_back(std::move(gd));
  }
  for (const auto& [gid, epoch] : s.epochs) {  // fenced GPUs: no page accounting until a new Hello
    if (s.gpus.contains(gid)) continue;
    GpuDump gd;
    gd.gpu = gid;
    gd.up = false;
    gd.epoch = epoch;
    d.gpus.push_back(std::move(gd));
  }
  std::sort(d.gpus.begin(), d.gpus.end(), [](const GpuDump& a, const GpuDump& b) { return a.gpu < b.gpu; });
  if (scope.all_requests) {
    for (const auto& [id, r] : s.requests) d.requests.push_back(RequestDumpOf(r));
  } else if (scope.request.has_value()) {
    auto it = s.requests.find(*scope.request);
    if (it != s.requests.end()) d.requests.push_back(RequestDumpOf(it->second));
  }
  AddReclaimRanks(s, policy, d.requests);
  const HostPageAllocator& host = s.host;
  d.host = HostDump{host.pages(), host.page_bytes(), host.reusable(), host.allocated(), host.pinned(),
                    host.freed_pinned()};
  d.prefix = prefix.Dump(scope.prefix_chains);  // issue 24: counts only (O(1)), chains in the `prefixes` view
  return d;
}

StateDump DumpOf(const State& s, const ReclaimPolicy& policy, const PrefixSharing& prefix, DumpDetail detail) {
  DumpScope scope;
  scope.all_requests = detail == DumpDetail::kFull;
  StateDump d = DumpOf(s, policy, prefix, scope);
  for (GpuDump& gd : d.gpus) {
    if (!scope.all_requests) break;
    if (!gd.up) continue;  // fenced: no page table
    DumpScope pages;
    pages.page_gpu = gd.gpu;
    pages.page_count = gd.pages;
    FillPageRows(s.gpus.at(gd.gpu).table, pages, gd);
  }
  return d;
}

}  // namespace dhs::memd::core
