// workerd/kv/resolver.cc: see resolver.h.
#include "workerd/kv/resolver.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace dhs {

// ---------------------------------------------------------------- shared checks

absl::Status Resolver::Validate(uint32_t group, std::span<const SourceId> sources,
                                std::span<ResolveQuery> batch) const {
  const KvLayout& l = *env_.layout;
  if (group >= census_.size()) return absl::InvalidArgumentError(absl::StrCat("resolver: unknown group ", group));
  if (sources.empty()) return absl::InvalidArgumentError("resolver: no sources");
  for (SourceId s : sources) {
    if (s >= l.num_sources() || l.group_of(s) != group) {
      return absl::InvalidArgumentError(absl::StrCat("resolver: source ", s, " is not in group ", group));
    }
  }
  const auto& group_sources = l.config().groups[group];
  // The whole group, each source once (any order): its hot cache is shared by the group's sources, so a slot filled
  // for some of them would be a hit with stale bytes for the others.
  bool whole = sources.size() == group_sources.size();
  for (size_t i = 0; whole && i < sources.size(); ++i) {
    whole = std::find(sources.begin(), sources.begin() + static_cast<std::ptrdiff_t>(i), sources[i]) ==
            sources.begin() + static_cast<std::ptrdiff_t>(i);
  }
  if (!whole) {
    return absl::InvalidArgumentError(absl::StrCat("resolver: ", sources.size(), " sources given, group ", group,
                                                   " has ", group_sources.size(),
                                                   ": pass each source of the group once"));
  }
  for (const ResolveQuery& q : batch) {
    if (q.kv == nullptr) return absl::InvalidArgumentError("resolver: query without request");
    if (q.out.size() != sources.size() * q.selection.size()) {
      return absl::InvalidArgumentError(absl::StrCat("resolver: output has ", q.out.size(), " entries, expected ",
                                                     sources.size() * q.selection.size()));
    }
    const Position n = q.kv->Length(group_sources);
    for (Position t : q.selection) {
      if (t < kNoPosition || t >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat("resolver: request ", q.kv->id, " selects position ", t, " but has ", n, " rows"));
      }
    }
    // Distinct positions (a top-k selection): a repeated miss would need its own LRU rule (resolver.h). An open
    // addressing table of at least 2k entries, reused across calls: O(k) per query, no allocation in steady state.
    // Entries carry the stamp of the query that wrote them, so the table is not cleared per query (only when it
    // grows or the stamp wraps).
    size_t cap = 16;
    while (cap < 2 * q.selection.size()) cap <<= 1;
    if (seen_.size() < cap || ++seen_stamp_ == 0) {
      seen_.assign(std::max(cap, seen_.size()), SeenEntry{});
      seen_stamp_ = 1;
    }
    cap = seen_.size();
    const uint32_t stamp = seen_stamp_;
    for (Position t : q.selection) {
      if (t == kNoPosition) continue;
      size_t i = static_cast<size_t>((static_cast<uint64_t>(t) * 0x9E3779B97F4A7C15ULL) >> 32) & (cap - 1);
      while (seen_[i].stamp == stamp && seen_[i].t != t) i = (i + 1) & (cap - 1);
      if (seen_[i].stamp == stamp) {
        return absl::InvalidArgumentError(
            absl::StrCat("resolver: request ", q.kv->id, " selects position ", t, " twice in one query"));
      }
      seen_[i] = SeenEntry{t, stamp};
    }
  }
  return absl::OkStatus();
}

const uint8_t* Resolver::HostRow(const KvPage& page, SourceId s, Position t) const {
  const KvLayout& l = *env_.layout;
  const uint32_t p = l.config().page_rows;
  return env_.host_pool.data() + static_cast<uint64_t>(page.host_page) * l.page_bytes() +
         l.InPage(s, static_cast<uint32_t>(t % p));
}

namespace {

// How one selected entry resolved. `index`: tail position, device page, or hot slot.
enum class Kind : uint8_t { kNone, kTail, kReady, kHot, kHost };
struct Entry {
  Kind kind = Kind::kNone;
  uint32_t hot = 0;
  int64_t page = 0;
};

// Step 1 for one entry, from the hot index only (the fused resolver). Returns true when resolved directly.
bool Direct(const KvLayout& l, const RequestKv& kv, std::span<const SourceId> group, Position t, Entry& e) {
  const KvConfig& c = l.config();
  if (kv.InTail(group, t, c.tail_rows)) {
    e.kind = Kind::kTail;
    return true;
  }
  const int32_t dp = kv.ReadyPage(t, c.page_rows);
  if (dp >= 0) {
    e.kind = Kind::kReady;
    e.page = dp;
    return true;
  }
  return false;
}

// Step 1 from the page record (the reference resolver: independent of the hot index, so the two resolvers agree only
// when the index is in step with the record).
bool DirectFromRecord(const KvLayout& l, const RequestKv& kv, std::span<const SourceId> group, Position t, Entry& e) {
  const KvConfig& c = l.config();
  if (kv.InTail(group, t, c.tail_rows)) {
    e.kind = Kind::kTail;
    return true;
  }
  const KvPage* pg = kv.Page(t, c.page_rows);
  if (pg != nullptr && pg->ready) {
    e.kind = Kind::kReady;
    e.page = pg->device_page;
    return true;
  }
  return false;
}

// Every output entry of every query is -1 after an error (resolver.h).
void ClearOutputs(std::span<ResolveQuery> batch) {
  for (ResolveQuery& q : batch) std::fill(q.out.begin(), q.out.end(), kNoLocation);
}

absl::Status NoCopy(const RequestKv& kv, Position t) {
  return absl::InternalError(absl::StrCat("resolver: row ", t, " of request ", kv.id,
                                          " is neither ready on GPU nor backed up on host (safety invariant)"));
}

Location LocationOf(const KvLayout& l, const RequestKv& kv, SourceId s, Position t, const Entry& e) {
  switch (e.kind) {
    case Kind::kTail: return l.TailRow(kv.slot, s, t);
    case Kind::kReady: return l.PageRow(static_cast<PageIndex>(e.page), s, static_cast<uint32_t>(t % l.config().page_rows));
    case Kind::kHot:
    case Kind::kHost: return l.HotRow(kv.slot, s, e.hot);
    case Kind::kNone: break;
  }
  return kNoLocation;
}

}  // namespace

// ---------------------------------------------------------------- fused

class PlannedBatch {
 public:
  uint32_t group = 0;
  std::vector<SourceId> sources;
  std::span<ResolveQuery> batch;
  std::vector<std::vector<Entry>> entries;           // [query][j]
  std::vector<std::pair<size_t, uint32_t>> assigned;  // (query, hot slot) targeted by host recovery
  std::vector<CopyEvent> events;                      // per follower
  std::vector<bool> issued;
  Census census;
};

void PlannedBatchDeleter::operator()(PlannedBatch* p) const { delete p; }

FusedResolver::FusedResolver(const ResolverEnv& env)
    : Resolver(env), groups_(static_cast<uint32_t>(env.layout->config().groups.size())) {
  const KvConfig& c = env.layout->config();
  caches_.reserve(size_t{c.slots} * groups_);
  for (size_t i = 0; i < size_t{c.slots} * groups_; ++i) caches_.emplace_back(c.hot_rows);
}

FusedResolver::~FusedResolver() = default;

void FusedResolver::ResetSlot(SlotIndex slot) {
  for (uint32_t g = 0; g < groups_; ++g) Cache(slot, g).Reset();
}

absl::StatusOr<PlannedBatchPtr> FusedResolver::Plan(uint32_t group, std::span<const SourceId> sources,
                                                                  std::span<ResolveQuery> batch) {
  if (absl::Status s = Validate(group, sources, batch); !s.ok()) {
    ClearOutputs(batch);
    return s;
  }
  const KvLayout& l = *env_.layout;
  const auto& gs = l.config().groups[group];
  PlannedBatchPtr plan(new PlannedBatch());
  plan->group = group;
  plan->sources.assign(sources.begin(), sources.end());
  plan->batch = batch;
  plan->entries.resize(batch.size());
  plan->events.resize(sources.size());
  plan->issued.assign(sources.size(), false);
  const uint64_t step = ++step_;
  // A planning error (INTERNAL, RESOURCE_EXHAUSTED) in query qi: the slots claimed by queries before it (and by qi)
  // hold rows whose bytes were never copied; they are invalidated, as after a failed copy (Finish). Hits touched so
  // far stay touched, as in the reference.
  auto fail = [&](absl::Status status) {
    for (auto [qq, hh] : plan->assigned) Cache(batch[qq].kv->slot, group).Invalidate(hh);
    ClearOutputs(batch);
    return status;
  };
  for (size_t qi = 0; qi < batch.size(); ++qi) {
    const ResolveQuery& q = batch[qi];
    q.kv->IndexPages();  // O(1) unless pages were added by hand
    auto& es = plan->entries[qi];
    es.resize(q.selection.size());
    for (Position t : q.selection) {
      if (t >= 0) q.kv->PrefetchIndex(t, l.config().page_rows);
    }
    size_t rest = 0;
    for (size_t j = 0; j < q.selection.size(); ++j) {  // (1) direct, from the hot index
      const Position t = q.selection[j];
      if (t == kNoPosition) continue;
      if (Direct(l, *q.kv, gs, t, es[j])) {
        ++plan->census.direct;
        continue;
      }
      if (!q.kv->HostReady(t, l.config().page_rows)) return fail(NoCopy(*q.kv, t));
      ++rest;
    }
    if (rest == 0) {
      ++plan->census.scans_skipped;
      continue;
    }
    HotCache& hc = Cache(q.kv->slot, group);
    for (size_t j = 0; j < q.selection.size(); ++j) {  // (2) hot hits, protected
      if (q.selection[j] == kNoPosition || es[j].kind != Kind::kNone) continue;
      const uint32_t h = hc.Find(q.selection[j]);
      if (h == HotCache::kNone) continue;
      hc.Touch(h, step);
      es[j] = Entry{Kind::kHot, h, 0};
      ++plan->census.hot;
    }
    for (size_t j = 0; j < q.selection.size(); ++j) {  // (3) misses take unprotected LRU victims
      if (q.selection[j] == kNoPosition || es[j].kind != Kind::kNone) continue;
      // Absent from the cache: not found in (2), and claims since then were of this query's other positions
      // (distinct, Validate); earlier queries' claims were hits in (2).
      const uint32_t h = hc.ClaimAbsent(q.selection[j], step);
      if (h == HotCache::kNone) {
        return fail(absl::ResourceExhaustedError(absl::StrCat(
            "resolver: request ", q.kv->id, " selects more distinct missing rows than B in one step")));
      }
      es[j] = Entry{Kind::kHost, h, 0};
      plan->assigned.emplace_back(qi, h);
      ++plan->census.host;
    }
  }
  return plan;
}

CopyEvent FusedResolver::IssueFollower(PlannedBatch& plan, size_t si) {
  const KvLayout& l = *env_.layout;
  const SourceId s = plan.sources[si];
  const uint32_t T = l.config().tail_rows;
  std::vector<HostToDeviceCopy>& ops = ops_;  // scratch, reused across calls
  std::vector<CopyEvent>& after = after_;
  ops.clear();
  after.clear();
  for (size_t qi = 0; qi < plan.batch.size(); ++qi) {
    const ResolveQuery& q = plan.batch[qi];
    const size_t k = q.selection.size();
    // One readers query for the request's whole hot region of this follower; per-row fences only when it is busy.
    enum { kUnknown, kIdle, kBusy } hot_readers = kUnknown;
    for (size_t j = 0; j < k; ++j) {
      const Position t = q.selection[j];
      const Entry& e = plan.entries[qi][j];
      q.out[si * k + j] = LocationOf(l, *q.kv, s, t, e);
      if (e.kind == Kind::kTail) {
        const CopyEvent& w = q.kv->tail_write[s][static_cast<size_t>(t % T)];
        if (!w.Done() || w.Failed()) after.push_back(w);  // a failed write fails the batch: the row is not there
      } else if (e.kind == Kind::kHost) {
        if (hot_readers == kUnknown) {
          const uint64_t bytes = uint64_t{l.config().hot_rows} * l.row_bytes(s);
          const DeviceRange region{env_.pool, l.HotRow(q.kv->slot, s, 0), bytes};
          hot_readers = env_.device->ReadersBusy(region) ? kBusy : kIdle;
        }
        const uint64_t row_bytes = l.row_bytes(s);
        const DeviceRange dst{env_.pool, q.out[si * k + j], row_bytes};
        if (hot_readers == kBusy && env_.device->ReadersBusy(dst)) after.push_back(env_.device->ReadersFence(dst));
        const uint8_t* src = HostRow(*q.kv->Page(t, l.config().page_rows), s, t);
        // Rows adjacent on both sides (consecutive positions of one host page into consecutive hot slots, the
        // common case of LRU victims taken in order) extend the previous copy: one memcpy per run, not per row.
        if (!ops.empty() && ops.back().dst.offset + static_cast<Location>(ops.back().dst.bytes) == dst.offset &&
            ops.back().src + ops.back().dst.bytes == src) {
          ops.back().dst.bytes += row_bytes;
        } else {
          ops.push_back(HostToDeviceCopy{dst, src});
        }
        plan.census.bytes_recovered += row_bytes;
      }
    }
  }
  plan.issued[si] = true;
  plan.events[si] = ops.empty() && after.empty() ? CopyEvent() : env_.device->CopyHostToDevice(ops, after);
  return plan.events[si];
}

absl::Status FusedResolver::Finish(PlannedBatchPtr plan) {
  for (size_t si = 0; si < plan->sources.size(); ++si) {
    if (!plan->issued[si]) IssueFollower(*plan, si);
  }
  absl::Status status;
  for (const CopyEvent& e : plan->events) {
    absl::Status s = e.Wait();
    if (status.ok() && !s.ok()) status = s;
  }
  if (!status.ok()) {
    for (auto [qi, h] : plan->assigned) Cache(plan->batch[qi].kv->slot, plan->group).Invalidate(h);
    ClearOutputs(plan->batch);
    return status;
  }
  Census& c = census_[plan->group];
  c += plan->census;
  return absl::OkStatus();
}

absl::Status FusedResolver::Resolve(uint32_t group, std::span<const SourceId> sources, std::span<ResolveQuery> batch) {
  absl::StatusOr<PlannedBatchPtr> plan = Plan(group, sources, batch);
  if (!plan.ok()) return plan.status();
  return Finish(*std::move(plan));
}

// ---------------------------------------------------------------- reference

ReferenceResolver::ReferenceResolver(const ResolverEnv& env)
    : Resolver(env), groups_(static_cast<uint32_t>(env.layout->config().groups.size())) {
  const KvConfig& c = env.layout->config();
  low_ = -static_cast<int64_t>(c.hot_rows);
  caches_.resize(size_t{c.slots} * groups_);
  for (Slots& s : caches_) Reset(s);
}

void ReferenceResolver::Reset(Slots& c) {
  const uint32_t b = env_.layout->config().hot_rows;
  c.pos.assign(b, kNoPosition);
  c.stamp.assign(b, 0);
  c.last_use.resize(b);
  for (uint32_t h = 0; h < b; ++h) c.last_use[h] = static_cast<int64_t>(h) - b;  // slot 0 least recent
}

void ReferenceResolver::ResetSlot(SlotIndex slot) {
  for (uint32_t g = 0; g < groups_; ++g) Reset(caches_[slot * groups_ + g]);
}

absl::Status ReferenceResolver::Resolve(uint32_t group, std::span<const SourceId> sources,
                                        std::span<ResolveQuery> batch) {
  if (absl::Status s = Validate(group, sources, batch); !s.ok()) {
    ClearOutputs(batch);
    return s;
  }
  const KvLayout& l = *env_.layout;
  const KvConfig& c = l.config();
  const auto& gs = c.groups[group];
  const uint64_t step = ++step_;
  Census add;
  std::vector<std::pair<Slots*, uint32_t>> assigned;
  auto fail = [&](absl::Status s) {
    for (auto [cache, h] : assigned) {
      cache->pos[h] = kNoPosition;
      cache->stamp[h] = 0;
      cache->last_use[h] = --low_;
    }
    ClearOutputs(batch);
    return s;
  };
  // Every query is planned (steps 1-2, victims) before any copy, as in the fused resolver: a failed copy of any
  // query then leaves the same hot-cache state in both (every query's hits touched, every claim invalidated).
  std::vector<std::vector<Entry>> entries(batch.size());
  for (size_t qi = 0; qi < batch.size(); ++qi) {
    ResolveQuery& q = batch[qi];
    const size_t k = q.selection.size();
    Slots& hc = caches_[q.kv->slot * groups_ + group];
    std::vector<Entry>& es = entries[qi];
    es.resize(k);
    bool all_direct = true;
    for (size_t j = 0; j < k; ++j) {
      const Position t = q.selection[j];
      if (t == kNoPosition || DirectFromRecord(l, *q.kv, gs, t, es[j])) continue;
      const KvPage* pg = q.kv->Page(t, c.page_rows);
      if (pg == nullptr || !pg->host_ready) return fail(NoCopy(*q.kv, t));
      all_direct = false;
    }
    for (const Entry& e : es) add.direct += (e.kind == Kind::kTail || e.kind == Kind::kReady);
    if (all_direct) ++add.scans_skipped;
    auto scan = [&](Position t) -> int64_t {
      for (uint32_t h = 0; h < hc.pos.size(); ++h) {
        if (hc.pos[h] == t) return h;
      }
      return -1;
    };
    for (size_t pass = 0; pass < 2 && !all_direct; ++pass) {  // pass 0: hits; pass 1: misses
      for (size_t j = 0; j < k; ++j) {
        const Position t = q.selection[j];
        if (t == kNoPosition || es[j].kind != Kind::kNone) continue;
        int64_t h = scan(t);
        if (h < 0 && pass == 1) {
          for (uint32_t v = 0; v < hc.pos.size(); ++v) {
            if (hc.stamp[v] != step && (h < 0 || hc.last_use[v] < hc.last_use[h])) h = v;
          }
          if (h < 0) return fail(absl::ResourceExhaustedError("reference resolver: union exceeds B"));
          hc.pos[h] = t;
          es[j] = Entry{Kind::kHost, static_cast<uint32_t>(h), 0};
          assigned.emplace_back(&hc, static_cast<uint32_t>(h));
          ++add.host;
        } else if (h >= 0) {
          es[j] = Entry{Kind::kHot, static_cast<uint32_t>(h), 0};
          ++add.hot;
        } else {
          continue;
        }
        hc.stamp[h] = step;
        hc.last_use[h] = ++clock_;
      }
    }
  }
  for (size_t qi = 0; qi < batch.size(); ++qi) {
    // Emit and recover this query's misses, one source at a time, waiting each copy.
    ResolveQuery& q = batch[qi];
    const size_t k = q.selection.size();
    const std::vector<Entry>& es = entries[qi];
    for (size_t si = 0; si < sources.size(); ++si) {
      const SourceId s = sources[si];
      for (size_t j = 0; j < k; ++j) {
        const Position t = q.selection[j];
        q.out[si * k + j] = LocationOf(l, *q.kv, s, t, es[j]);
        if (es[j].kind == Kind::kTail) {
          if (absl::Status w = q.kv->tail_write[s][static_cast<size_t>(t % c.tail_rows)].Wait(); !w.ok()) {
            return fail(w);
          }
        } else if (es[j].kind == Kind::kHost) {
          const DeviceRange dst{env_.pool, q.out[si * k + j], l.row_bytes(s)};
          CopyEvent fence = env_.device->ReadersFence(dst);
          HostToDeviceCopy op{dst, HostRow(*q.kv->Page(t, c.page_rows), s, t)};
          if (absl::Status w = env_.device->CopyHostToDevice({&op, 1}, {&fence, 1}).Wait(); !w.ok()) return fail(w);
          add.bytes_recovered += l.row_bytes(s);
        }
      }
    }
  }
  census_[group] += add;
  return absl::OkStatus();
}

}  // namespace dhs
