// workerd/kv/resolver.cc: see resolver.h.
#include "workerd/kv/resolver.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "workerd/kv/resolver_plan.h"

namespace dhs {

// ---------------------------------------------------------------- shared checks

absl::Status Resolver::Validate(uint32_t group, std::span<const SourceId> sources,
                                std::span<ResolveQuery> batch) const {
  if (absl::Status s = ValidateSources(group, sources); !s.ok()) return s;
  const auto& group_sources = env_.layout->config().groups[group];
  for (const ResolveQuery& q : batch) {
    if (absl::Status s = ValidateQuery(group_sources, sources.size(), q); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// A known group, and `sources` is that whole group, each source once (any order).
absl::Status Resolver::ValidateSources(uint32_t group, std::span<const SourceId> sources) const {
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
  return absl::OkStatus();
}

// One query: a request, an output of num_sources * k entries, appended positions (or -1), each at most once.
absl::Status Resolver::ValidateQuery(std::span<const SourceId> group_sources, size_t num_sources,
                                     const ResolveQuery& q) const {
  if (q.kv == nullptr) return absl::InvalidArgumentError("resolver: query without request");
  if (q.out.size() != num_sources * q.selection.size()) {
    return absl::InvalidArgumentError(absl::StrCat("resolver: output has ", q.out.size(), " entries, expected ",
                                                   num_sources * q.selection.size()));
  }
  const Position n = q.kv->Length(group_sources);
  for (Position t : q.selection) {
    if (t < kNoPosition || t >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("resolver: request ", q.kv->id, " selects position ", t, " but has ", n, " rows"));
    }
  }
  return CheckDistinct(q, n);
}

// Distinct positions (a top-k selection): a repeated miss would need its own LRU rule (resolver.h). O(k) per query,
// no allocation in steady state. When the request's n positions need at most 64 bits per selected row (n <= 64 k), a
// bitmap of n bits, cleared per query (n / 8 bytes: at most 8 bytes per selected row), answers with one bit test per
// row in a table small enough to stay in cache. Otherwise an open-addressing table of at least 2k entries, reused
// across calls: entries carry the stamp of the query that wrote them, so the table is not cleared per query (only
// when it grows or the stamp wraps).
absl::Status Resolver::CheckDistinct(const ResolveQuery& q, Position n) const {
  auto repeated = [&](Position t) {
    return absl::InvalidArgumentError(
        absl::StrCat("resolver: request ", q.kv->id, " selects position ", t, " twice in one query"));
  };
  if (n <= Position{64} * static_cast<Position>(q.selection.size())) {
    seen_bits_.assign(static_cast<size_t>((n + 63) / 64), 0);
    for (Position t : q.selection) {
      if (t == kNoPosition) continue;
      uint64_t& word = seen_bits_[static_cast<size_t>(t >> 6)];
      const uint64_t bit = uint64_t{1} << (t & 63);
      if (word & bit) return repeated(t);
      word |= bit;
    }
    return absl::OkStatus();
  }
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
    size_t i = plan::HashOf(t, static_cast<uint32_t>(cap - 1));
    while (seen_[i].stamp == stamp && seen_[i].t != t) i = (i + 1) & (cap - 1);
    if (seen_[i].stamp == stamp) return repeated(t);
    seen_[i] = SeenEntry{t, stamp};
  }
  return absl::OkStatus();
}

absl::Status Resolver::VerifyHostPage(RequestKv& kv, Position t) const {
  if (!env_.verify_host_page) return absl::OkStatus();
  const auto pg = static_cast<uint32_t>(t / env_.layout->config().page_rows);
  if (kv.pages[pg].Verified()) return absl::OkStatus();
  return env_.verify_host_page(kv, pg);
}

const uint8_t* Resolver::HostRow(const KvPage& page, SourceId s, Position t) const {
  const KvLayout& l = *env_.layout;
  const uint32_t p = l.config().page_rows;
  return env_.host_pool.data() + static_cast<uint64_t>(page.host_page) * l.host_page_bytes() +
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
  if (pg != nullptr && pg->Ready()) {
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
  PlannedBatchPtr plan = spare_ ? std::move(spare_) : PlannedBatchPtr(new PlannedBatch());
  plan->group = group;
  plan->sources.assign(sources.begin(), sources.end());
  plan->batch = batch;
  plan->entries.resize(batch.size());  // each query's entries are reset by PlanDirect
  plan->assigned.clear();
  plan->events.assign(sources.size(), CopyEvent());
  plan->issued.assign(sources.size(), false);
  plan->census = Census{};
  const uint64_t step = ++step_;
  for (size_t qi = 0; qi < batch.size(); ++qi) {
    if (absl::Status s = PlanQuery(*plan, qi, step); !s.ok()) return FailPlan(*plan, std::move(s));
  }
  return plan;
}

// Steps 1-2 and the victims of query qi: direct rows, then (unless every row resolved directly) hot hits touched
// and misses given LRU victims.
absl::Status FusedResolver::PlanQuery(PlannedBatch& plan, size_t qi, uint64_t step) {
  absl::StatusOr<size_t> rest = PlanDirect(plan, qi);
  if (!rest.ok()) return rest.status();
  if (*rest == 0) {
    ++plan.census.scans_skipped;
    return absl::OkStatus();
  }
  HotCache& hc = Cache(plan.batch[qi].kv->slot, plan.group);
  PlanHotHits(plan, qi, hc, step);
  return PlanMisses(plan, qi, hc, step);
}

// Step 1 of query qi, from the hot index: tail or ready rows. Returns how many rows are left for the hot cache, or
// INTERNAL for a row with neither a GPU nor a host copy.
absl::StatusOr<size_t> FusedResolver::PlanDirect(PlannedBatch& plan, size_t qi) const {
  const KvLayout& l = *env_.layout;
  const auto& gs = l.config().groups[plan.group];
  const ResolveQuery& q = plan.batch[qi];
  q.kv->IndexPages();  // O(1) unless pages were added by hand
  auto& es = plan.entries[qi];
  es.assign(q.selection.size(), Entry{});
  for (Position t : q.selection) {
    if (t >= 0) q.kv->PrefetchIndex(t, l.config().page_rows);
  }
  size_t rest = 0;
  for (size_t j = 0; j < q.selection.size(); ++j) {
    const Position t = q.selection[j];
    if (t == kNoPosition) continue;
    if (Direct(l, *q.kv, gs, t, es[j])) {
      ++plan.census.direct;
      continue;
    }
    if (!q.kv->HostReady(t, l.config().page_rows)) return NoCopy(*q.kv, t);
    ++rest;
  }
  return rest;
}

// Step 2 of query qi: rows in the hot cache are touched (so protected from this step's victim choice).
void FusedResolver::PlanHotHits(PlannedBatch& plan, size_t qi, HotCache& hc, uint64_t step) {
  const ResolveQuery& q = plan.batch[qi];
  auto& es = plan.entries[qi];
  for (size_t j = 0; j < q.selection.size(); ++j) {
    if (q.selection[j] != kNoPosition && es[j].kind == Kind::kNone) hc.Prefetch(q.selection[j]);
  }
  for (size_t j = 0; j < q.selection.size(); ++j) {
    if (q.selection[j] == kNoPosition || es[j].kind != Kind::kNone) continue;
    const uint32_t h = hc.Find(q.selection[j]);
    if (h == HotCache::kNone) continue;
    hc.Touch(h, step);
    es[j] = Entry{Kind::kHot, h, 0};
    ++plan.census.hot;
  }
}

// Victims for query qi: each remaining miss claims an unprotected LRU slot for host recovery; RESOURCE_EXHAUSTED
// when none is left.
absl::Status FusedResolver::PlanMisses(PlannedBatch& plan, size_t qi, HotCache& hc, uint64_t step) {
  const ResolveQuery& q = plan.batch[qi];
  auto& es = plan.entries[qi];
  for (size_t j = 0; j < q.selection.size(); ++j) {
    if (q.selection[j] == kNoPosition || es[j].kind != Kind::kNone) continue;
    // Absent from the cache: not found in (2), and claims since then were of this query's other positions
    // (distinct, Validate); earlier queries' claims were hits in (2).
    const uint32_t h = hc.ClaimAbsent(q.selection[j], step);
    if (h == HotCache::kNone) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "resolver: request ", q.kv->id, " selects more distinct missing rows than B in one step"));
    }
    es[j] = Entry{Kind::kHost, h, 0};
    plan.assigned.emplace_back(qi, h);
    ++plan.census.host;
    if (absl::Status v = VerifyHostPage(*q.kv, q.selection[j]); !v.ok()) return v;
  }
  return absl::OkStatus();
}

// A planning error (INTERNAL, RESOURCE_EXHAUSTED) in some query: the slots claimed by the queries before it (and by
// it) hold rows whose bytes were never copied; they are invalidated, as after a failed copy (Finish). Hits touched
// so far stay touched, as in the reference. Returns `status`.
absl::Status FusedResolver::FailPlan(PlannedBatch& plan, absl::Status status) {
  for (auto [qq, hh] : plan.assigned) Cache(plan.batch[qq].kv->slot, plan.group).Invalidate(hh);
  ClearOutputs(plan.batch);
  return status;
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
  spare_ = std::move(plan);
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

struct ReferenceResolver::Planned {
  std::vector<std::vector<Entry>> entries;         // [query][j]
  std::vector<std::pair<Slots*, uint32_t>> assigned;  // hot slots claimed for host recovery, in claim order
  Census add;                                        // committed only when the whole batch resolved
};

absl::Status ReferenceResolver::Resolve(uint32_t group, std::span<const SourceId> sources,
                                        std::span<ResolveQuery> batch) {
  if (absl::Status s = Validate(group, sources, batch); !s.ok()) {
    ClearOutputs(batch);
    return s;
  }
  const uint64_t step = ++step_;
  Planned p;
  // Every query is planned (steps 1-2, victims) before any copy, as in the fused resolver: a failed copy of any
  // query then leaves the same hot-cache state in both (every query's hits touched, every claim invalidated).
  p.entries.resize(batch.size());
  for (size_t qi = 0; qi < batch.size(); ++qi) {
    if (absl::Status s = PlanQuery(p, group, batch[qi], qi, step); !s.ok()) return Fail(p, batch, std::move(s));
  }
  for (size_t qi = 0; qi < batch.size(); ++qi) {
    if (absl::Status s = EmitQuery(p, sources, batch[qi], qi); !s.ok()) return Fail(p, batch, std::move(s));
  }
  census_[group] += p.add;
  return absl::OkStatus();
}

// Steps 1-2 and the victims of query q (index qi): the hot cache is scanned unless every row resolved directly.
absl::Status ReferenceResolver::PlanQuery(Planned& p, uint32_t group, const ResolveQuery& q, size_t qi,
                                          uint64_t step) {
  Slots& hc = caches_[q.kv->slot * groups_ + group];
  p.entries[qi].resize(q.selection.size());
  absl::StatusOr<bool> all_direct = PlanDirect(p, group, q, qi);
  if (!all_direct.ok()) return all_direct.status();
  if (*all_direct) return absl::OkStatus();
  return PlanHot(p, hc, q, qi, step);
}

// Step 1 of query q, from the page record: tail or ready rows, counted in the census. Returns whether every row
// resolved directly, or INTERNAL for a row with neither a GPU nor a host copy.
absl::StatusOr<bool> ReferenceResolver::PlanDirect(Planned& p, uint32_t group, const ResolveQuery& q,
                                                   size_t qi) const {
  const KvLayout& l = *env_.layout;
  const KvConfig& c = l.config();
  const auto& gs = c.groups[group];
  std::vector<Entry>& es = p.entries[qi];
  bool all_direct = true;
  for (size_t j = 0; j < q.selection.size(); ++j) {
    const Position t = q.selection[j];
    if (t == kNoPosition || DirectFromRecord(l, *q.kv, gs, t, es[j])) continue;
    const KvPage* pg = q.kv->Page(t, c.page_rows);
    if (pg == nullptr || !pg->HostReady()) return NoCopy(*q.kv, t);
    all_direct = false;
  }
  for (const Entry& e : es) p.add.direct += (e.kind == Kind::kTail || e.kind == Kind::kReady);
  if (all_direct) ++p.add.scans_skipped;
  return all_direct;
}

// Step 2 and the victims of query q, in two passes: pass 0 touches the hits; pass 1 gives each miss the least
// recently used slot not yet used in this step (RESOURCE_EXHAUSTED when none is left).
absl::Status ReferenceResolver::PlanHot(Planned& p, Slots& hc, const ResolveQuery& q, size_t qi, uint64_t step) {
  std::vector<Entry>& es = p.entries[qi];
  for (size_t pass = 0; pass < 2; ++pass) {
    for (size_t j = 0; j < q.selection.size(); ++j) {
      const Position t = q.selection[j];
      if (t == kNoPosition || es[j].kind != Kind::kNone) continue;
      int64_t h = Scan(hc, t);
      if (h < 0 && pass == 1) {
        h = Victim(hc, step);
        if (h < 0) return absl::ResourceExhaustedError("reference resolver: union exceeds B");
        hc.pos[h] = t;
        es[j] = Entry{Kind::kHost, static_cast<uint32_t>(h), 0};
        p.assigned.emplace_back(&hc, static_cast<uint32_t>(h));
        ++p.add.host;
        if (absl::Status v = VerifyHostPage(*q.kv, t); !v.ok()) return v;
      } else if (h >= 0) {
        es[j] = Entry{Kind::kHot, static_cast<uint32_t>(h), 0};
        ++p.add.hot;
      } else {
        continue;
      }
      hc.stamp[h] = step;
      hc.last_use[h] = ++clock_;
    }
  }
  return absl::OkStatus();
}

// The slot holding row t (linear scan), -1 when none.
int64_t ReferenceResolver::Scan(const Slots& hc, Position t) {
  for (uint32_t h = 0; h < hc.pos.size(); ++h) {
    if (hc.pos[h] == t) return h;
  }
  return -1;
}

// The least recently used slot not used in `step` (the first such on ties), -1 when every slot is.
int64_t ReferenceResolver::Victim(const Slots& hc, uint64_t step) {
  int64_t h = -1;
  for (uint32_t v = 0; v < hc.pos.size(); ++v) {
    if (hc.stamp[v] != step && (h < 0 || hc.last_use[v] < hc.last_use[h])) h = v;
  }
  return h;
}

// Emits query q's locations and recovers its misses, one source at a time, waiting each tail write and each copy.
absl::Status ReferenceResolver::EmitQuery(Planned& p, std::span<const SourceId> sources, const ResolveQuery& q,
                                          size_t qi) {
  const KvLayout& l = *env_.layout;
  const size_t k = q.selection.size();
  const std::vector<Entry>& es = p.entries[qi];
  for (size_t si = 0; si < sources.size(); ++si) {
    const SourceId s = sources[si];
    for (size_t j = 0; j < k; ++j) {
      const Position t = q.selection[j];
      q.out[si * k + j] = LocationOf(l, *q.kv, s, t, es[j]);
      if (es[j].kind == Kind::kTail) {
        if (absl::Status w = q.kv->tail_write[s][static_cast<size_t>(t % l.config().tail_rows)].Wait(); !w.ok()) {
          return w;
        }
      } else if (es[j].kind == Kind::kHost) {
        if (absl::Status w = RecoverRow(p, q, s, t, q.out[si * k + j]); !w.ok()) return w;
      }
    }
  }
  return absl::OkStatus();
}

// Copies row t of source s from its host page to `dst` (a hot slot) after the slot's readers, and waits the copy.
absl::Status ReferenceResolver::RecoverRow(Planned& p, const ResolveQuery& q, SourceId s, Position t, Location dst) {
  const KvLayout& l = *env_.layout;
  const DeviceRange range{env_.pool, dst, l.row_bytes(s)};
  CopyEvent fence = env_.device->ReadersFence(range);
  HostToDeviceCopy op{range, HostRow(*q.kv->Page(t, l.config().page_rows), s, t)};
  if (absl::Status w = env_.device->CopyHostToDevice({&op, 1}, {&fence, 1}).Wait(); !w.ok()) return w;
  p.add.bytes_recovered += l.row_bytes(s);
  return absl::OkStatus();
}

// Any error: every slot the batch claimed is emptied and made least recent (in claim order), every output is -1.
// Returns `status`.
absl::Status ReferenceResolver::Fail(Planned& p, std::span<ResolveQuery> batch, absl::Status status) {
  for (auto [cache, h] : p.assigned) {
    cache->pos[h] = kNoPosition;
    cache->stamp[h] = 0;
    cache->last_use[h] = --low_;
  }
  ClearOutputs(batch);
  return status;
}

}  // namespace dhs
