#include "memd/state_dump.h"

#include <algorithm>
#include <charconv>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace dhs::memd {
namespace {

using json = nlohmann::json;

std::string Owner(RequestId r) { return r == kNoOwner ? "-" : absl::StrCat(r); }

std::string Coverage(const RequestDump& r) { return absl::StrFormat("%d/%d", r.host_pages, r.history_pages); }

json WorkerJson(const std::optional<WorkerShape>& w) {
  if (!w || !w->declared()) return json(nullptr);
  json j{{"serving_mode", w->serving_mode}};
  ForEachNumericField(*w, [&j](const char* key, const auto& value) { j[key] = value; });
  return j;
}

json GpuJson(const GpuDump& g) {
  return json{{"gpu", g.gpu},
              {"up", g.up},
              {"epoch", g.epoch},
              {"M", g.pages},
              {"M_req", g.required_pages},
              {"M_opt", g.optional_pages},
              {"M_res", g.reserve_pages},
              {"free", g.free_pages},
              {"optional_pending", g.pending_pages},
              {"optional_ready", g.ready_pages},
              {"reclaiming", g.reclaiming_pages},
              {"queued", g.queue.size()},
              {"reclaims_in_flight", g.reclaims_in_flight},
              {"reclaimable", g.reclaimable_pages},
              {"slots", g.request_slots},
              {"slots_used", g.used_slots},
              {"queued_required", g.queued_required_pages},
              {"queued_host", g.queued_host_pages},
              {"draft_ring_pages", g.draft_ring_pages},
              {"draft_ring_bytes", g.draft_ring_bytes},
              {"staging_pages", g.staging_pages},
              {"staging_bytes", g.staging_bytes},
              {"declared_draft_ring_bytes", g.declared_draft_ring_bytes},
              {"declared_staging_bytes", g.declared_staging_bytes},
              {"worker", WorkerJson(g.worker)},
              {"model", g.model_fingerprint == 0 ? json(nullptr) : json(absl::StrFormat("%016x", g.model_fingerprint))}};
}

// with_host_copies: the `request N` view's "host_copies" ([[history page, host page], ...]) and "record_tokens".
json RequestJson(const RequestDump& r, bool with_host_copies = false) {
  json j{{"request", r.request},
           {"gpu", r.gpu},
           {"slot", r.slot == kNoSlot ? json(nullptr) : json(r.slot)},
           {"state", RequestStateName(r.state)},
           {"required_pages", r.required_pages},
           {"a_r", r.optional_pages},
           {"history_pages", r.history_pages},
           {"host_pages", r.host_pages},
           {"host_coverage", Coverage(r)},
           {"tail_pages", r.tail_pages},
           {"admitted_at_us", r.admitted_at_us},
           {"reclaim_rank", r.reclaim_rank},
           {"draft_ring_pages", r.draft_ring_pages},
           {"draft_ring_bytes", r.draft_ring_bytes},
           {"staging_pages", r.staging_pages},
           {"staging_bytes", r.staging_bytes}};
  if (with_host_copies) {
    json copies = json::array();
    for (const auto& [page, host_page] : r.host_copies) copies.push_back(json::array({page, host_page}));
    j["host_copies"] = std::move(copies);
    j["record_tokens"] = r.record_tokens ? json(*r.record_tokens) : json(nullptr);
  }
  return j;
}

json HostJson(const HostDump& h) {
  return json{{"pages", h.pages},
              {"page_bytes", h.page_bytes},
              {"reusable", h.reusable_pages},
              {"allocated", h.allocated_pages},
              {"pinned", h.pinned_pages},
              {"freed_pinned", h.freed_pinned_pages}};
}

json QueueJson(const StateDump& d) {
  json q = json::array();
  for (const GpuDump& g : d.gpus) {
    for (size_t i = 0; i < g.queue.size(); ++i) q.push_back({{"gpu", g.gpu}, {"position", i}, {"request", g.queue[i]}});
  }
  return q;
}

const RequestDump* FindRequest(const StateDump& d, RequestId id) {
  for (const RequestDump& r : d.requests) {
    if (r.request == id) return &r;
  }
  return nullptr;
}

const GpuDump* FindGpu(const StateDump& d, GpuId id) {
  for (const GpuDump& g : d.gpus) {
    if (g.gpu == id) return &g;
  }
  return nullptr;
}

// RING / STAGE: pages of M_req held by draft rings / staging reservations (issue 13).
std::string GpuHeader() {
  return absl::StrFormat("%-4s %7s %7s %7s %7s %7s %7s %7s %7s %7s %-6s %5s %6s %6s\n", "GPU", "M", "M_req", "M_opt",
                         "M_res", "free", "pending", "ready", "queued", "reclaim", "STATE", "EPOCH", "RING", "STAGE");
}
std::string GpuRow(const GpuDump& g) {
  return absl::StrFormat("%-4d %7d %7d %7d %7d %7d %7d %7d %7d %7d %-6s %5d %6d %6d\n", g.gpu, g.pages,
                         g.required_pages, g.optional_pages, g.reserve_pages, g.free_pages, g.pending_pages,
                         g.ready_pages, g.queue.size(), g.reclaims_in_flight, g.up ? "up" : "fenced", g.epoch,
                         g.draft_ring_pages, g.staging_pages);
}
// One line per GPU with speculation memory declared or in use: bytes (the table's RING / STAGE columns are pages).
std::string GpuSpeculationLines(const StateDump& d) {
  std::string out;
  for (const GpuDump& g : d.gpus) {
    if (g.declared_draft_ring_bytes == 0 && g.declared_staging_bytes == 0 && g.draft_ring_bytes == 0 &&
        g.staging_bytes == 0) {
      continue;
    }
    absl::StrAppendFormat(&out,
                          "GPU %d speculation: draft ring %d pages = %d bytes in use (%d declared), staging %d pages = "
                          "%d bytes in use (%d declared)\n",
                          g.gpu, g.draft_ring_pages, g.draft_ring_bytes, g.declared_draft_ring_bytes, g.staging_pages,
                          g.staging_bytes, g.declared_staging_bytes);
  }
  return out;
}
// One line per GPU whose worker declared its shape (issue 14): what `dhsctl plan --live` plans with.
std::string GpuWorkerLines(const StateDump& d) {
  std::string out;
  for (const GpuDump& g : d.gpus) {
    if (!g.worker || !g.worker->declared()) continue;
    const WorkerShape& w = *g.worker;
    absl::StrAppendFormat(&out,
                          "GPU %d worker: %s, p %d, L_pay %d, L_idx %d x %d B keys, k %d, B %d, T %d, N %d, "
                          "K_max %d, W %d, chi %d, model %s\n",
                          g.gpu, w.serving_mode, w.page_rows, w.payload_sources, w.index_producers, w.index_key_bytes,
                          w.top_k, w.hot_rows, w.tail_rows, w.request_slots, w.k_max, w.drafter_window,
                          w.staging_arenas,
                          g.model_fingerprint == 0 ? "unknown" : absl::StrFormat("%016x", g.model_fingerprint));
  }
  return out;
}
std::string RequestHeader() {
  return absl::StrFormat("%-8s %4s %5s %-10s %5s %5s %9s %5s %5s %5s %5s\n", "REQUEST", "GPU", "SLOT", "STATE", "REQ",
                         "A_R", "HOST", "TAIL", "RANK", "RING", "STAGE");
}
std::string RequestRow(const RequestDump& r) {
  const std::string slot = r.slot == kNoSlot ? "-" : absl::StrCat(r.slot);
  return absl::StrFormat("%-8d %4d %5s %-10s %5d %5d %9s %5d %5d %5d %5d\n", r.request, r.gpu, slot,
                         RequestStateName(r.state), r.required_pages, r.optional_pages, Coverage(r), r.tail_pages,
                         r.reclaim_rank, r.draft_ring_pages, r.staging_pages);
}
std::string QueueTable(const StateDump& d) {
  std::string out = absl::StrFormat("%-4s %8s %-8s\n", "GPU", "POSITION", "REQUEST");
  for (const GpuDump& g : d.gpus) {
    for (size_t i = 0; i < g.queue.size(); ++i) absl::StrAppendFormat(&out, "%-4d %8d %-8d\n", g.gpu, i, g.queue[i]);
  }
  return out;
}

// The first page after the rows shown; g.pages (M) when the rows reach the last page.
uint64_t NextPage(const GpuDump& g, const DumpView& view) {
  if (view.runs) return g.page_runs.empty() ? g.pages : g.page_runs.back().first + uint64_t{g.page_runs.back().count};
  return uint64_t{g.page_from} + g.page_states.size();
}

json OwnerJson(RequestId r) { return r == kNoOwner ? json(nullptr) : json(r); }

// {"gpu", "M", "from", "pages": [{"page", "state", "owner"}] or "runs": [{"first", "count", "state", "owner"}],
//  "next": the first page not shown, null when the rows reach page M-1}.
json PagesJson(const GpuDump& g, const DumpView& view) {
  json rows = json::array();
  if (view.runs) {
    for (const PageRun& r : g.page_runs) {
      rows.push_back(
          {{"first", r.first}, {"count", r.count}, {"state", PageStateName(r.state)}, {"owner", OwnerJson(r.owner)}});
    }
  } else {
    for (size_t i = 0; i < g.page_states.size(); ++i) {
      rows.push_back({{"page", g.page_from + i}, {"state", PageStateName(g.page_states[i])},
                      {"owner", OwnerJson(g.page_owners[i])}});
    }
  }
  const uint64_t next = NextPage(g, view);
  return json{{"gpu", g.gpu}, {"M", g.pages}, {"from", g.page_from}, {view.runs ? "runs" : "pages", rows},
              {"next", next < g.pages ? json(next) : json(nullptr)}};
}

std::string PagesTable(const GpuDump& g, const DumpView& view) {
  std::string out;
  if (view.runs) {
    out = absl::StrFormat("%-9s %9s %-16s %-8s\n", "FIRST", "COUNT", "STATE", "OWNER");
    for (const PageRun& r : g.page_runs) {
      absl::StrAppendFormat(&out, "%-9d %9d %-16s %-8s\n", r.first, r.count, PageStateName(r.state), Owner(r.owner));
    }
  } else {
    out = absl::StrFormat("%-6s %-16s %-8s\n", "PAGE", "STATE", "OWNER");
    for (size_t i = 0; i < g.page_states.size(); ++i) {
      absl::StrAppendFormat(&out, "%-6d %-16s %-8s\n", g.page_from + i, PageStateName(g.page_states[i]),
                            Owner(g.page_owners[i]));
    }
  }
  const uint64_t next = NextPage(g, view);
  if (next < g.pages) {
    absl::StrAppendFormat(&out, "... pages %d..%d of GPU %d not shown (M = %d): --from %d for the next rows%s\n",
                          next, g.pages - 1, g.gpu, g.pages, next, view.runs ? "" : ", --runs for runs of pages");
  }
  return out;
}

bool ParseNumber(std::string_view s, uint64_t& out) {
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

// "pages G [from F] [count N] [runs]": the options after the GPU, in any order.
absl::Status ParsePageOptions(const std::vector<std::string>& words, DumpView& v) {
  for (size_t i = 2; i < words.size(); ++i) {
    uint64_t n = 0;
    if (words[i] == "runs") {
      v.runs = true;
    } else if ((words[i] == "from" || words[i] == "count") && i + 1 < words.size() && ParseNumber(words[i + 1], n)) {
      if (words[i] == "from" && n > UINT32_MAX) return absl::InvalidArgumentError("pages: from is beyond any page");
      if (words[i] == "count" && (n == 0 || n > kMaxPageRows)) {
        return absl::InvalidArgumentError(absl::StrFormat("pages: count must be in 1..%d, got %d", kMaxPageRows, n));
      }
      (words[i] == "from" ? v.from : v.count) = static_cast<uint32_t>(n);
      ++i;
    } else {
      return absl::InvalidArgumentError(
          absl::StrFormat("pages: unknown option '%s' (pages GPU [from F] [count N] [runs])", words[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DumpView> ParseDumpView(std::string_view text) {
  // absl::string_view is not std::string_view in Debian's absl: spell the conversion.
  const std::vector<std::string> words =
      absl::StrSplit(absl::string_view(text.data(), text.size()), ' ', absl::SkipEmpty());
  const std::string word = words.empty() ? std::string() : words[0];
  DumpView v;
  uint64_t n = 0;
  if ((word == "request" || word == "pages") && (words.size() < 2 || !ParseNumber(words[1], n))) {
    return absl::InvalidArgumentError(absl::StrFormat("view '%s' needs a number", std::string(text)));
  }
  if ((word == "request" && words.size() > 2) || (word != "request" && word != "pages" && words.size() > 1)) {
    return absl::InvalidArgumentError(absl::StrFormat("view '%s' takes no argument", std::string(text)));
  }
  if (word == "status") v.kind = DumpView::Kind::kStatus;
  else if (word == "gpus") v.kind = DumpView::Kind::kGpus;
  else if (word == "requests") v.kind = DumpView::Kind::kRequests;
  else if (word == "queue") v.kind = DumpView::Kind::kQueue;
  else if (word == "prefixes") v.kind = DumpView::Kind::kPrefixes;
  else if (word == "request") { v.kind = DumpView::Kind::kRequest; v.request = n; }
  else if (word == "pages") { v.kind = DumpView::Kind::kPages; v.gpu = static_cast<GpuId>(n); }
  else {
    return absl::InvalidArgumentError(absl::StrFormat(
        "unknown view '%s' (views: status, gpus, requests, request ID, pages GPU, queue, prefixes)",
        std::string(text)));
  }
  if (v.kind == DumpView::Kind::kPages) {
    if (absl::Status s = ParsePageOptions(words, v); !s.ok()) return s;
  }
  return v;
}

DumpScope DumpScopeOf(const DumpView& view) {
  DumpScope scope;
  switch (view.kind) {
    case DumpView::Kind::kRequests: scope.all_requests = true; break;
    case DumpView::Kind::kRequest: scope.request = view.request; break;
    case DumpView::Kind::kPages:
      scope.page_gpu = view.gpu;
      scope.page_from = view.from;
      scope.page_count = std::clamp<uint32_t>(view.count, 1, kMaxPageRows);
      scope.page_runs = view.runs;
      break;
    case DumpView::Kind::kPrefixes: scope.prefix_chains = true; break;
    default: break;  // status, gpus, queue: the counts alone
  }
  return scope;
}

json PrefixJson(const PrefixDump& p) {
  return json{{"eviction_policy", p.eviction_policy}, {"tenant_quota_pages", p.tenant_quota_pages},
              {"writing_pages", p.writing_pages}, {"shared_pages", p.shared_pages}, {"cached_pages", p.cached_pages},
              {"lookups", p.lookups}, {"hits", p.hits}, {"misses", p.misses},
              {"content_mismatches", p.content_mismatches}, {"stored", p.stored}, {"abandoned", p.abandoned},
              {"evictions", p.evictions}, {"quota_refusals", p.quota_refusals}, {"adopted", p.adopted}};
}

// `prefixes`: one object per chain (issue 24); {"enabled": false, "chains": []} with sharing off.
json PrefixesJson(const PrefixDump& p) {
  json chains = json::array();
  for (const PrefixDump::Chain& c : p.chains) {
    chains.push_back(json{{"tenant", absl::StrFormat("%016x", c.tenant)}, {"chain", absl::StrFormat("%016x", c.chain)},
                          {"blocks", c.blocks}, {"pages", c.pages}, {"shared", c.shared}, {"cached", c.cached},
                          {"writing", c.writing}, {"holders", c.holders}, {"last_use_us", c.last_use_us}});
  }
  return json{{"enabled", p.enabled}, {"chains", chains}};
}

std::string PrefixesTable(const PrefixDump& p) {
  if (!p.enabled) return "prefix sharing is off (memd --prefix-sharing on)\n";
  std::string out = absl::StrFormat("%-16s %-16s %6s %5s %6s %6s %7s %7s %14s\n", "tenant", "chain", "blocks", "pages",
                                    "shared", "cached", "writing", "holders", "last_use_us");
  for (const PrefixDump::Chain& c : p.chains) {
    absl::StrAppendFormat(&out, "%016x %016x %6d %5d %6d %6d %7d %7d %14d\n", c.tenant, c.chain, c.blocks, c.pages,
                          c.shared, c.cached, c.writing, c.holders, c.last_use_us);
  }
  return out;
}

std::string PrefixLine(const PrefixDump& p) {
  return absl::StrFormat(
      "prefix sharing (%s): %d shared, %d cached, %d writing host pages; %d lookups, %d hits, %d misses (%d content "
      "mismatches), %d evictions\n",
      p.eviction_policy, p.shared_pages, p.cached_pages, p.writing_pages, p.lookups, p.hits, p.misses,
      p.content_mismatches, p.evictions);
}

// Issue 26: the cluster tier (only when memd --cluster-store is given).
json ClusterJson(const ClusterDump& c) {
  json shed = json::object(), misses = json::object(), bad = json::object();
  for (const auto& [k, v] : c.shed) shed[k] = v;
  for (const auto& [k, v] : c.misses) misses[k] = v;
  for (const auto& [k, v] : c.bad_values) bad[k] = v;
  return json{{"store", c.store}, {"health", c.health}, {"reachable", c.reachable}, {"queue_depth", c.queue_depth},
              {"queue_bytes", c.queue_bytes}, {"offered", c.offered}, {"published", c.published},
              {"published_bytes", c.published_bytes}, {"publish_failed", c.publish_failed}, {"shed", shed},
              {"lookups", c.lookups}, {"hits", c.hits}, {"hit_bytes", c.hit_bytes}, {"imported", c.imported},
              {"imported_bytes", c.imported_bytes}, {"session_lookups", c.session_lookups},
              {"session_hits", c.session_hits}, {"session_imported", c.session_imported}, {"misses", misses},
              {"bad_values", bad}};
}

std::string ClusterLines(const ClusterDump& c) {
  auto join = [](const std::vector<std::pair<std::string, uint64_t>>& v) {
    std::string s;
    for (const auto& [k, n] : v) {
      if (n == 0) continue;
      absl::StrAppendFormat(&s, "%s%s %d", s.empty() ? "" : ", ", k, n);
    }
    return s.empty() ? std::string("none") : s;
  };
  return absl::StrFormat(
      "cluster tier %s (%s, reachable: %s): queue %d pages / %d bytes; published %d pages / %d bytes (%d failed), "
      "shed: %s\n"
      "cluster tier lookups: %d pages, %d hits (%d bytes), %d imported (%d bytes), misses: %s\n"
      "cluster tier sessions: %d pages looked up, %d hits, %d imported\n",
      c.store, c.health, c.reachable, c.queue_depth, c.queue_bytes, c.published, c.published_bytes, c.publish_failed,
      join(c.shed),
      c.lookups, c.hits, c.hit_bytes, c.imported, c.imported_bytes, join(c.misses), c.session_lookups,
      c.session_hits, c.session_imported);
}

nlohmann::json DumpToJson(const StateDump& d, const DumpView& view) {
  switch (view.kind) {
    case DumpView::Kind::kStatus: {
      json gpus = json::array();
      for (const GpuDump& g : d.gpus) gpus.push_back(GpuJson(g));
      json status{{"policy", d.policy}, {"now_us", d.now_us}, {"gpus", gpus}, {"requests", d.request_count},
                  {"host", HostJson(d.host)}};
      if (d.prefix.enabled) status["prefix"] = PrefixJson(d.prefix);  // issue 24
      if (d.cluster.configured) status["cluster"] = ClusterJson(d.cluster);  // issue 26
      return status;
    }
    case DumpView::Kind::kGpus: {
      json gpus = json::array();
      for (const GpuDump& g : d.gpus) gpus.push_back(GpuJson(g));
      return gpus;
    }
    case DumpView::Kind::kRequests: {
      json rs = json::array();
      for (const RequestDump& r : d.requests) rs.push_back(RequestJson(r));
      return rs;
    }
    case DumpView::Kind::kRequest: {
      const RequestDump* r = FindRequest(d, view.request);
      if (!r) return json{{"error", absl::StrFormat("request %d not found", view.request)}};
      return RequestJson(*r, /*with_host_copies=*/true);
    }
    case DumpView::Kind::kPages: {
      const GpuDump* g = FindGpu(d, view.gpu);
      if (!g) return json{{"error", absl::StrFormat("GPU %d not found", view.gpu)}};
      if (view.from >= g->pages) {
        return json{{"error", absl::StrFormat("GPU %d has M = %d pages: from %d is beyond its last page", g->gpu,
                                              g->pages, view.from)}};
      }
      return PagesJson(*g, view);
    }
    case DumpView::Kind::kQueue: return QueueJson(d);
    case DumpView::Kind::kPrefixes: {
      json out = PrefixesJson(d.prefix);
      if (d.cluster.configured) out["cluster"] = ClusterJson(d.cluster);  // issue 26
      return out;
    }
  }
  return json{{"error", "unknown view"}};
}

std::string DumpToTable(const StateDump& d, const DumpView& view) {
  std::string out;
  switch (view.kind) {
    case DumpView::Kind::kPrefixes:  // issue 24 (and issue 26's cluster tier)
      return PrefixesTable(d.prefix) + (d.cluster.configured ? ClusterLines(d.cluster) : std::string());
    case DumpView::Kind::kStatus:
      out = absl::StrFormat("policy %s, %d requests, host pool %d/%d pages reusable (%d pinned)\n", d.policy,
                            d.request_count, d.host.reusable_pages, d.host.pages, d.host.pinned_pages);
      if (d.prefix.enabled) out += PrefixLine(d.prefix);  // issue 24
      if (d.cluster.configured) out += ClusterLines(d.cluster);  // issue 26
      out += GpuHeader();
      for (const GpuDump& g : d.gpus) out += GpuRow(g);
      return out + GpuSpeculationLines(d) + GpuWorkerLines(d);
    case DumpView::Kind::kGpus:
      out = GpuHeader();
      for (const GpuDump& g : d.gpus) out += GpuRow(g);
      return out + GpuSpeculationLines(d);
    case DumpView::Kind::kRequests:
      out = RequestHeader();
      for (const RequestDump& r : d.requests) out += RequestRow(r);
      return out;
    case DumpView::Kind::kRequest: {
      const RequestDump* r = FindRequest(d, view.request);
      if (!r) return absl::StrFormat("request %d: not found\n", view.request);
      out = RequestHeader() + RequestRow(*r);
      if (r->draft_ring_pages != 0 || r->staging_pages != 0) {
        absl::StrAppendFormat(&out, "speculation: draft ring %d pages = %d bytes, staging %d pages = %d bytes\n",
                              r->draft_ring_pages, r->draft_ring_bytes, r->staging_pages, r->staging_bytes);
      }
      return out;
    }
    case DumpView::Kind::kPages: {
      const GpuDump* g = FindGpu(d, view.gpu);
      if (!g) return absl::StrFormat("GPU %d: not found\n", view.gpu);
      if (view.from >= g->pages) {
        return absl::StrFormat("GPU %d has M = %d pages: from %d is beyond its last page\n", g->gpu, g->pages,
                               view.from);
      }
      return PagesTable(*g, view);
    }
    case DumpView::Kind::kQueue: return QueueTable(d);
  }
  return "unknown view\n";
}

namespace {

// RenderPrometheus's phases, each appending its metrics to `out` in the order the page lists them.

// The GPU pool's pages by kind, then the speculation shares (issue 13), by GPU.
void AppendGpuPages(const StateDump& d, std::string& out) {
  out += "# HELP dhs_memd_gpu_pages GPU KV pool pages by kind (brief section 4: M, M_req, M_opt, M_res).\n";
  out += "# TYPE dhs_memd_gpu_pages gauge\n";
  for (const GpuDump& g : d.gpus) {
    const std::pair<const char*, uint32_t> kinds[] = {
        {"total", g.pages},          {"required", g.required_pages}, {"optional", g.optional_pages},
        {"reserve", g.reserve_pages}, {"free", g.free_pages},        {"optional_pending", g.pending_pages},
        {"optional_ready", g.ready_pages}, {"reclaiming", g.reclaiming_pages}};
    for (const auto& [kind, v] : kinds) {
      absl::StrAppendFormat(&out, "dhs_memd_gpu_pages{gpu=\"%d\",kind=\"%s\"} %d\n", g.gpu, kind, v);
    }
  }
  // Speculation shares (issue 13), each a gauge by GPU and kind (draft_ring, staging).
  const auto speculation_gauge = [&](const char* name, const char* help, auto ring, auto staging) {
    absl::StrAppendFormat(&out, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
    for (const GpuDump& g : d.gpus) {
      absl::StrAppendFormat(&out, "%s{gpu=\"%d\",kind=\"draft_ring\"} %d\n", name, g.gpu, ring(g));
      absl::StrAppendFormat(&out, "%s{gpu=\"%d\",kind=\"staging\"} %d\n", name, g.gpu, staging(g));
    }
  };
  speculation_gauge("dhs_memd_gpu_speculation_pages",
                    "GPU pages of the admitted requests' speculation shares by kind, part of M_req (issue 13: "
                    "draft_ring, staging).",
                    [](const GpuDump& g) { return g.draft_ring_pages; }, [](const GpuDump& g) { return g.staging_pages; });
  speculation_gauge("dhs_memd_gpu_speculation_bytes",
                    "Bytes of the admitted requests' speculation shares by kind (issue 13: draft_ring = R_d * draft "
                    "bytes per row, staging = M_stage / N, per request).",
                    [](const GpuDump& g) { return g.draft_ring_bytes; }, [](const GpuDump& g) { return g.staging_bytes; });
  speculation_gauge("dhs_memd_gpu_declared_speculation_bytes",
                    "The worker's speculation memory for its N slots as its Hello declared it (issue 13: draft_ring = "
                    "N * R_d * draft bytes per row, staging = M_stage).",
                    [](const GpuDump& g) { return g.declared_draft_ring_bytes; },
                    [](const GpuDump& g) { return g.declared_staging_bytes; });
}

// Each GPU's registration (up, epoch) and queues (admissions waiting, reclaims in flight).
void AppendGpuRegistrations(const StateDump& d, std::string& out) {
  out += "# HELP dhs_memd_gpu_up 1 while the GPU's worker is registered and live, 0 once fenced (dead or hung).\n";
  out += "# TYPE dhs_memd_gpu_up gauge\n";
  for (const GpuDump& g : d.gpus) absl::StrAppendFormat(&out, "dhs_memd_gpu_up{gpu=\"%d\"} %d\n", g.gpu, g.up ? 1 : 0);
  out += "# HELP dhs_memd_gpu_epoch Accepted registrations of the GPU (a new epoch per re-registration).\n";
  out += "# TYPE dhs_memd_gpu_epoch gauge\n";
  for (const GpuDump& g : d.gpus) absl::StrAppendFormat(&out, "dhs_memd_gpu_epoch{gpu=\"%d\"} %d\n", g.gpu, g.epoch);
  out += "# HELP dhs_memd_queued_admissions Admissions waiting for GPU pages.\n# TYPE dhs_memd_queued_admissions gauge\n";
  for (const GpuDump& g : d.gpus) absl::StrAppendFormat(&out, "dhs_memd_queued_admissions{gpu=\"%d\"} %d\n", g.gpu, g.queue.size());
  out += "# HELP dhs_memd_reclaims_in_flight Reclaims started and not yet retired.\n# TYPE dhs_memd_reclaims_in_flight gauge\n";
  for (const GpuDump& g : d.gpus) {
    absl::StrAppendFormat(&out, "dhs_memd_reclaims_in_flight{gpu=\"%d\"} %d\n", g.gpu, g.reclaims_in_flight);
  }
}

// The host pool's pages by kind and the request count.
// Issue 24: the host tier's pages and lookups (only when prefix sharing is on).
void AppendPrefix(const PrefixDump& p, std::string& out) {
  if (!p.enabled) return;
  out += "# HELP dhs_memd_prefix_pages Shared prefix host pages by state.\n# TYPE dhs_memd_prefix_pages gauge\n";
  const std::pair<const char*, uint32_t> pages[] = {
      {"writing", p.writing_pages}, {"shared", p.shared_pages}, {"cached", p.cached_pages}};
  for (const auto& [state, v] : pages) absl::StrAppendFormat(&out, "dhs_memd_prefix_pages{state=\"%s\"} %d\n", state, v);
  const std::pair<const char*, uint64_t> counters[] = {
      {"lookups", p.lookups},   {"hits", p.hits},           {"misses", p.misses},
      {"content_mismatches", p.content_mismatches},          {"stored", p.stored},
      {"abandoned", p.abandoned}, {"evictions", p.evictions}, {"quota_refusals", p.quota_refusals},
      {"adopted", p.adopted}};
  for (const auto& [name, v] : counters) {
    absl::StrAppendFormat(&out, "# TYPE dhs_memd_prefix_%s_total counter\ndhs_memd_prefix_%s_total %d\n", name, name, v);
  }
  // Per tier (brief §12 "tiers of a prefix lookup"): memd knows `host` (imported from its pool) and `miss` (computed,
  // as far as the host tier knows); a worker's row cache (`worker`) is counted by workerd.
  out += "# HELP dhs_memd_prefix_tier_pages_total Shareable pages looked up at grants, by the tier that served them.\n"
         "# TYPE dhs_memd_prefix_tier_pages_total counter\n";
  absl::StrAppendFormat(&out, "dhs_memd_prefix_tier_pages_total{tier=\"host\"} %d\n", p.hits);
  absl::StrAppendFormat(&out, "dhs_memd_prefix_tier_pages_total{tier=\"miss\"} %d\n", p.misses);
  absl::StrAppendFormat(&out,
                        "# HELP dhs_memd_prefix_prefill_tokens_saved_total Prefill tokens (rows) of host-tier hits.\n"
                        "# TYPE dhs_memd_prefix_prefill_tokens_saved_total counter\n"
                        "dhs_memd_prefix_prefill_tokens_saved_total %d\n"
                        "# HELP dhs_memd_prefix_bytes_saved_total Host bytes of host-tier hits (not allocated again).\n"
                        "# TYPE dhs_memd_prefix_bytes_saved_total counter\n"
                        "dhs_memd_prefix_bytes_saved_total %d\n"
                        "# TYPE dhs_memd_prefix_stored_blocks gauge\ndhs_memd_prefix_stored_blocks %d\n",
                        p.hit_rows, p.hit_bytes, p.stored_blocks);
}

// Issue 26: the cluster tier (only when memd --cluster-store is given).
void AppendCluster(const ClusterDump& c, std::string& out) {
  if (!c.configured) return;
  out += "# HELP dhs_memd_cluster_store_up The cluster tier's store as the publisher sees it (1 up, 0 down or "
         "probing).\n# TYPE dhs_memd_cluster_store_up gauge\n";
  absl::StrAppendFormat(&out, "dhs_memd_cluster_store_up %d\n", c.health == "up" ? 1 : 0);
  out += "# HELP dhs_memd_cluster_store_reachable Whether the store answered memd's latest contact (start PING, "
         "publish or lookup batch): 1 yes, 0 no or not contacted yet.\n# TYPE dhs_memd_cluster_store_reachable gauge\n";
  absl::StrAppendFormat(&out, "dhs_memd_cluster_store_reachable %d\n", c.reachable == "yes" ? 1 : 0);
  out += "# HELP dhs_memd_cluster_store_health The cluster tier's store health (1 for the current state).\n"
         "# TYPE dhs_memd_cluster_store_health gauge\n";
  for (const char* h : {"up", "down", "probing"}) {
    absl::StrAppendFormat(&out, "dhs_memd_cluster_store_health{state=\"%s\"} %d\n", h, c.health == h ? 1 : 0);
  }
  absl::StrAppendFormat(&out,
                        "# HELP dhs_memd_cluster_queue_pages Pages queued to publish (write-behind).\n"
                        "# TYPE dhs_memd_cluster_queue_pages gauge\ndhs_memd_cluster_queue_pages %d\n"
                        "# HELP dhs_memd_cluster_queue_bytes Key and value bytes queued to publish.\n"
                        "# TYPE dhs_memd_cluster_queue_bytes gauge\ndhs_memd_cluster_queue_bytes %d\n",
                        c.queue_depth, c.queue_bytes);
  const std::tuple<const char*, const char*, uint64_t> counters[] = {
      {"offered", "Confirmed shared pages offered to the write-behind queue.", c.offered},
      {"published", "Pages the store confirmed written.", c.published},
      {"published_bytes", "Key and value bytes the store confirmed written.", c.published_bytes},
      {"publish_failed", "Pages of publish batches the store did not confirm (not retried).", c.publish_failed},
      {"lookups", "Pages asked of the store at admissions.", c.lookups},
      {"hits", "Pages found in the store and checked.", c.hits},
      {"hit_bytes", "Payload bytes of the pages found.", c.hit_bytes},
      {"imported", "Found pages copied into the host pool (granted as host hits).", c.imported},
      {"imported_bytes", "Payload bytes copied into the host pool.", c.imported_bytes},
      {"session_lookups", "Of the lookups, pages asked by a session address (a next turn's history pages).",
       c.session_lookups},
      {"session_hits", "Of the hits, pages found by a session address.", c.session_hits},
      {"session_imported", "Of the imported pages, pages found by a session address.", c.session_imported}};
  for (const auto& [name, help, v] : counters) {
    absl::StrAppendFormat(&out, "# HELP dhs_memd_cluster_%s_total %s\n# TYPE dhs_memd_cluster_%s_total counter\n"
                          "dhs_memd_cluster_%s_total %d\n", name, help, name, name, v);
  }
  out += "# HELP dhs_memd_cluster_shed_total Pages the write-behind queue shed, by reason.\n"
         "# TYPE dhs_memd_cluster_shed_total counter\n";
  for (const auto& [k, v] : c.shed) absl::StrAppendFormat(&out, "dhs_memd_cluster_shed_total{reason=\"%s\"} %d\n", k, v);
  out += "# HELP dhs_memd_cluster_misses_total Pages of admissions not imported from the store, by reason.\n"
         "# TYPE dhs_memd_cluster_misses_total counter\n";
  for (const auto& [k, v] : c.misses) {
    absl::StrAppendFormat(&out, "dhs_memd_cluster_misses_total{reason=\"%s\"} %d\n", k, v);
  }
  out += "# HELP dhs_memd_cluster_bad_values_total Values refused by the page value check, by error.\n"
         "# TYPE dhs_memd_cluster_bad_values_total counter\n";
  for (const auto& [k, v] : c.bad_values) {
    absl::StrAppendFormat(&out, "dhs_memd_cluster_bad_values_total{error=\"%s\"} %d\n", k, v);
  }
}

void AppendHostPages(const StateDump& d, std::string& out) {
  out += "# HELP dhs_memd_host_pages Host pool pages by kind.\n# TYPE dhs_memd_host_pages gauge\n";
  const std::pair<const char*, uint32_t> host[] = {{"total", d.host.pages},
                                                   {"reusable", d.host.reusable_pages},
                                                   {"allocated", d.host.allocated_pages},
                                                   {"pinned", d.host.pinned_pages},
                                                   {"freed_pinned", d.host.freed_pinned_pages}};
  for (const auto& [kind, v] : host) absl::StrAppendFormat(&out, "dhs_memd_host_pages{kind=\"%s\"} %d\n", kind, v);
  absl::StrAppendFormat(&out, "# TYPE dhs_memd_requests gauge\ndhs_memd_requests %d\n", d.request_count);
}

// The core's and the daemon's counters (dhs_memd_<name>_total), then the worker count.
void AppendCounters(const Counters& c, const DaemonCounters& daemon, std::string& out) {
  const std::pair<const char*, uint64_t> counters[] = {
      {"events", c.events},
      {"event_errors", c.event_errors},
      {"ticks", c.ticks},
      {"admissions", c.admissions},
      {"grants", c.grants},
      {"waits", c.waits},
      {"rejects", c.rejects},
      {"completions", c.completions},
      {"reclaims_started", c.reclaims_started},
      {"reclaims_retired", c.reclaims_retired},
      {"reclaims_failed", c.reclaims_failed},
      {"pages_retired", c.pages_retired},
      {"backups_ordered", c.backups_ordered},
      {"backups_failed", c.backups_failed},
      {"populates_ordered", c.populates_ordered},
      {"populates_failed", c.populates_failed},
      {"stale_reports", c.stale_reports},
      {"host_writes", c.host_writes},
      {"host_write_failures", c.host_write_failures},
      {"deferred_backups", c.deferred_backups},
      {"keeps_lost", c.keeps_lost},
      {"fences", c.fences},
      {"reregistrations", c.reregistrations},
      {"requests_interrupted", c.requests_interrupted},
      {"admissions_fenced", c.admissions_fenced},
      {"host_pages_lost", c.host_pages_lost},
      {"resumes", c.resumes},
      {"host_pages_resumed", c.host_pages_resumed},
      {"requests_adopted", c.requests_adopted},
      {"host_pages_adopted", c.host_pages_adopted},
      {"host_pages_held", c.host_pages_held},
      {"requests_reported", c.requests_reported},
      {"reports_refused", c.reports_refused},
      {"workers_lost", daemon.workers_lost},
      {"fenced_refused", daemon.fenced_refused},
      {"messages", daemon.messages},
      {"hellos", daemon.hellos},
      {"send_failures", daemon.send_failures},
      {"refused_peers", daemon.refused_peers},
      {"foreign_request_ids", daemon.foreign_request_ids}};
  for (const auto& [name, v] : counters) {
    absl::StrAppendFormat(&out, "# TYPE dhs_memd_%s_total counter\ndhs_memd_%s_total %d\n", name, name, v);
  }
  absl::StrAppendFormat(&out, "# TYPE dhs_memd_workers gauge\ndhs_memd_workers %d\n", daemon.workers);
  if (daemon.kv_events) {  // issue 24: the KV event stream (memd --kv-events on)
    const std::pair<const char*, uint64_t> kv[] = {{"published", daemon.kv_events_published},
                                                   {"dropped", daemon.kv_events_dropped},
                                                   {"subscriptions", daemon.kv_event_subscriptions}};
    for (const auto& [name, v] : kv) {
      absl::StrAppendFormat(&out, "# TYPE dhs_memd_kv_events_%s_total counter\ndhs_memd_kv_events_%s_total %d\n", name,
                            name, v);
    }
  }
}

}  // namespace

std::string RenderPrometheus(const StateDump& d, const Counters& c, const DaemonCounters& daemon) {
  std::string out;
  AppendGpuPages(d, out);
  AppendGpuRegistrations(d, out);
  AppendHostPages(d, out);
  AppendPrefix(d.prefix, out);
  AppendCounters(c, daemon, out);
  AppendCluster(daemon.cluster, out);  // issue 26
  return out;
}

}  // namespace dhs::memd
