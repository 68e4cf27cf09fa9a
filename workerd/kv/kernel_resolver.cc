// workerd/kv/kernel_resolver.cc: see kernel_resolver.h.
#include "workerd/kv/kernel_resolver.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "workerd/kv/resolver_plan_host.h"

namespace dhs {
namespace {

PlanRunner& RunnerSlot() {
  static PlanRunner* runner = new PlanRunner();
  return *runner;
}

constexpr uint64_t kAlign = 256;
uint64_t Aligned(uint64_t n) { return (n + kAlign - 1) & ~(kAlign - 1); }

// Bytes of a query's per-step arrays in the arena: selection, output, and the copy of its request's hot index.
uint64_t QueryBytes(uint64_t k, uint64_t ns, uint64_t pages) {
  return Aligned(k * 8) + Aligned(ns * k * 8) + Aligned(pages * 4) + Aligned(pages) + Aligned(pages * 8);
}

}  // namespace

void SetDevicePlanRunner(PlanRunner runner) { RunnerSlot() = std::move(runner); }
const PlanRunner& DevicePlanRunner() { return RunnerSlot(); }

// One block of shared memory (DeviceCompute::AllocateShared), freed with the resolver.
struct KernelResolver::Shared {
  DeviceCompute* compute = nullptr;
  uint8_t* data = nullptr;
  uint64_t bytes = 0;
  ~Shared() {
    if (data != nullptr) compute->FreeShared(data);
  }
  static absl::StatusOr<std::unique_ptr<Shared>> Make(DeviceCompute* compute, uint64_t bytes) {
    absl::StatusOr<void*> p = compute->AllocateShared(std::max<uint64_t>(bytes, 1));
    if (!p.ok()) return p.status();
    auto s = std::make_unique<Shared>();
    s->compute = compute;
    s->data = static_cast<uint8_t*>(*p);
    s->bytes = bytes;
    return s;
  }
};

KernelResolver::KernelResolver(const ResolverEnv& env, DeviceCompute* compute, PlanRunner runner)
    : Resolver(env), compute_(compute), runner_(std::move(runner)),
      groups_(static_cast<uint32_t>(env.layout->config().groups.size())),
      hot_rows_(env.layout->config().hot_rows) {}

KernelResolver::~KernelResolver() {
  // Shared memory is freed after this: no kernel may still use it. A failure is logged (nothing left to fail).
  if (absl::Status s = compute_->Synchronize(); !s.ok()) spdlog::warn("KernelResolver: at shutdown: {}", s.ToString());
}

absl::StatusOr<std::unique_ptr<KernelResolver>> KernelResolver::Create(const ResolverEnv& env, DeviceCompute* compute,
                                                                       PlanRunner runner) {
  if (compute == nullptr) return absl::InvalidArgumentError("KernelResolver: the device has no compute side");
  if (!runner) return absl::InvalidArgumentError("KernelResolver: no plan runner");
  std::unique_ptr<KernelResolver> r(new KernelResolver(env, compute, std::move(runner)));
  r->pool_base_ = compute->PoolAddress(env.pool, 0);
  r->host_base_ = env.host_pool.empty() ? nullptr : compute->MappedHostAddress(env.host_pool.data());
  if (r->pool_base_ == nullptr) return absl::InvalidArgumentError("KernelResolver: no device address of the KV pool");
  if (!env.host_pool.empty() && r->host_base_ == nullptr) {
    return absl::InvalidArgumentError("KernelResolver: the host pool is not mapped for the device");
  }
  const uint64_t slots = env.layout->config().slots, b = r->hot_rows_;
  for (uint32_t g = 0; g < r->groups_; ++g) {
    absl::StatusOr<std::unique_ptr<Shared>> c = Shared::Make(compute, slots * b * 8 * 3 + slots * 8);
    if (!c.ok()) return c.status();
    r->caches_.push_back(*std::move(c));
  }
  for (SlotIndex slot = 0; slot < slots; ++slot) r->ResetSlot(slot);
  return r;
}

// Group g's block: pos [slots * B], last_use [slots * B], stamp [slots * B], clock [slots].
plan::HotSlots KernelResolver::View(uint32_t group, SlotIndex slot) const {
  const uint64_t slots = env_.layout->config().slots, b = hot_rows_;
  auto* base = reinterpret_cast<int64_t*>(caches_[group]->data);
  return plan::HotSlots{base + slot * b, base + slots * b + slot * b,
                        reinterpret_cast<uint64_t*>(base + 2 * slots * b) + slot * b, base + 3 * slots * b + slot};
}

void KernelResolver::ResetSlot(SlotIndex slot) {
  // No kernel runs here: Resolve synchronizes before it returns (Launch), so the host may write the caches.
  for (uint32_t g = 0; g < groups_; ++g) {
    const plan::HotSlots c = View(g, slot);
    for (uint32_t h = 0; h < hot_rows_; ++h) {  // as HotCache: empty, slot 0 least recent
      c.pos[h] = plan::kNone;
      c.stamp[h] = 0;
      c.last_use[h] = static_cast<int64_t>(h) - static_cast<int64_t>(hot_rows_);
    }
    *c.clock = 0;
  }
}

Position KernelResolver::HotPosition(SlotIndex slot, uint32_t group, uint32_t h) const {
  return View(group, slot).pos[h];
}

bool KernelResolver::HotHolds(SlotIndex slot, uint32_t group, Position t) const {
  if (t == kNoPosition) return false;
  const plan::HotSlots c = View(group, slot);
  return std::find(c.pos, c.pos + hot_rows_, t) != c.pos + hot_rows_;
}

absl::StatusOr<uint8_t*> KernelResolver::Arena(uint64_t bytes) {
  if (arena_ == nullptr || arena_->bytes < bytes) {
    arena_.reset();
    absl::StatusOr<std::unique_ptr<Shared>> a = Shared::Make(compute_, bytes + bytes / 2);
    if (!a.ok()) return a.status();
    arena_ = *std::move(a);
  }
  return arena_->data;
}

absl::Status KernelResolver::Resolve(uint32_t group, std::span<const SourceId> sources,
                                     std::span<ResolveQuery> batch) {
  for (ResolveQuery& q : batch) std::fill(q.out.begin(), q.out.end(), kNoLocation);
  last_launches_ = 0;
  if (absl::Status s = Validate(group, sources, batch); !s.ok()) return s;
  if (absl::Status s = Prepare(group, sources, batch); !s.ok()) return s;
  if (absl::Status s = Stage(group, sources, batch); !s.ok()) return s;
  if (absl::Status s = Launch(group, batch.size()); !s.ok()) return s;
  return Collect(group, batch);
}

// Steps 1 and 2 (kernel_resolver.h): host pages verified, tail writes and hot-region readers waited.
absl::Status KernelResolver::Prepare(uint32_t group, std::span<const SourceId> sources,
                                     std::span<ResolveQuery> batch) {
  const KvLayout& l = *env_.layout;
  const KvConfig& c = l.config();
  const std::vector<SourceId>& gs = c.groups[group];
  for (ResolveQuery& q : batch) {
    RequestKv& kv = *q.kv;
    kv.IndexPages();
    for (Position t : q.selection) {
      if (t == kNoPosition) continue;
      if (kv.InTail(gs, t, c.tail_rows)) {
        for (SourceId s : sources) {
          if (absl::Status w = kv.tail_write[s][static_cast<size_t>(t % c.tail_rows)].Wait(); !w.ok()) return w;
        }
      } else if (kv.ReadyPage(t, c.page_rows) < 0 && kv.HostReady(t, c.page_rows)) {
        if (absl::Status v = VerifyHostPage(kv, t); !v.ok()) return v;
      }
    }
    for (SourceId s : sources) {
      const DeviceRange region{env_.pool, l.HotRow(kv.slot, s, 0), uint64_t{c.hot_rows} * l.row_bytes(s)};
      if (env_.device->ReadersBusy(region)) {
        if (absl::Status w = env_.device->ReadersFence(region).Wait(); !w.ok()) return w;
      }
    }
  }
  return absl::OkStatus();
}

// Step 3's arguments in the arena: the geometry of `sources`, then each query with its arrays (selection, output,
// a copy of its request's hot index), in launch order: launch L holds the L-th query of each request slot (so each
// slot at most once per launch, and a slot's queries in batch order).
absl::Status KernelResolver::Stage(uint32_t group, std::span<const SourceId> sources, std::span<ResolveQuery> batch) {
  const KvLayout& l = *env_.layout;
  const KvConfig& c = l.config();
  const uint64_t ns = sources.size(), n = batch.size();
  uint32_t k_max = 0;
  uint64_t bytes = 3 * Aligned(ns * 8) + Aligned(n * sizeof(plan::Query)) + Aligned(n * sizeof(plan::QueryResult));
  std::vector<uint32_t> nth(c.slots, 0), launch(n);
  uint32_t launches = 0;
  for (size_t i = 0; i < n; ++i) {
    k_max = std::max<uint32_t>(k_max, static_cast<uint32_t>(batch[i].selection.size()));
    bytes += QueryBytes(batch[i].selection.size(), ns, batch[i].kv->pages.size());
    launch[i] = nth[batch[i].kv->slot]++;
    launches = std::max(launches, launch[i] + 1);
  }
  order_.resize(n);
  for (size_t i = 0; i < n; ++i) order_[i] = static_cast<uint32_t>(i);
  std::stable_sort(order_.begin(), order_.end(), [&](uint32_t a, uint32_t b) { return launch[a] < launch[b]; });
  launch_end_.assign(launches, 0);
  for (size_t i = 0; i < n; ++i) ++launch_end_[launch[i]];
  for (uint32_t L = 1; L < launches; ++L) launch_end_[L] += launch_end_[L - 1];
  stride_ = Aligned(plan::ScratchBytes(k_max, hot_rows_));
  bytes += n * stride_;
  // The arena is rewritten: no kernel of the last Resolve runs any more (Launch synchronized).
  absl::StatusOr<uint8_t*> arena = Arena(bytes);
  if (!arena.ok()) return arena.status();
  uint8_t* at = *arena;
  auto take = [&](uint64_t b) {
    uint8_t* p = at;
    at += Aligned(b);
    return p;
  };
  const plan::GeometryStorage geo(l, sources);
  geometry_ = geo.g;
  auto copy_u64 = [&](const std::vector<uint64_t>& v) {
    return static_cast<const uint64_t*>(std::memcpy(take(ns * 8), v.data(), ns * 8));
  };
  geometry_.slot_src = copy_u64(geo.slot_src);
  geometry_.in_page = copy_u64(geo.in_page);
  geometry_.row_bytes = copy_u64(geo.row_bytes);
  queries_ = reinterpret_cast<plan::Query*>(take(n * sizeof(plan::Query)));
  results_ = reinterpret_cast<plan::QueryResult*>(take(n * sizeof(plan::QueryResult)));
  scratch_ = take(n * stride_);
  for (size_t a = 0; a < n; ++a) queries_[a] = StageQuery(group, batch[order_[a]], ns, take);
  return absl::OkStatus();
}

// One query's arrays, taken from the arena by `take`, and its plan::Query (as plan::MakeQuery builds it).
plan::Query KernelResolver::StageQuery(uint32_t group, const ResolveQuery& rq, uint64_t ns,
                                       const std::function<uint8_t*(uint64_t)>& take) const {
  const KvConfig& c = env_.layout->config();
  const RequestKv& kv = *rq.kv;
  const uint64_t k = rq.selection.size(), pages = kv.pages.size();
  plan::Query q;
  q.slot = kv.slot;
  Position hi = INT64_MIN;
  for (SourceId s : c.groups[group]) hi = std::max(hi, kv.TailEnd(s));
  q.tail_low = hi - static_cast<int64_t>(c.tail_rows);
  auto* sel = reinterpret_cast<int64_t*>(take(k * 8));
  std::memcpy(sel, rq.selection.data(), k * 8);
  q.out = reinterpret_cast<int64_t*>(take(ns * k * 8));
  auto* ready = reinterpret_cast<int32_t*>(take(pages * 4));
  uint8_t* host_ready = take(pages);
  auto* host_page = reinterpret_cast<int64_t*>(take(pages * 8));
  std::memcpy(ready, kv.ready_page.data(), pages * 4);
  std::memcpy(host_ready, kv.host_ready.data(), pages);
  for (size_t j = 0; j < pages; ++j) host_page[j] = kv.pages[j].host_page;
  q.pages = pages;
  q.ready_page = ready;
  q.host_ready = host_ready;
  q.host_page = host_page;
  q.selection = sel;
  q.k = static_cast<uint32_t>(k);
  q.cache = View(group, kv.slot);
  return q;
}

// Step 3: the launches, in order, with one step number; then waits for them. The rows each hot slot of the batch's
// request slots held before are kept: a planning error invalidates the slots claimed since.
absl::Status KernelResolver::Launch(uint32_t group, size_t n) {
  const uint32_t b = hot_rows_;
  pos_before_.clear();
  before_slots_.clear();
  for (size_t a = 0; a < n; ++a) {
    const SlotIndex slot = queries_[a].slot;
    if (std::find(before_slots_.begin(), before_slots_.end(), slot) != before_slots_.end()) continue;
    before_slots_.push_back(slot);
    const plan::HotSlots cache = View(group, slot);
    pos_before_.insert(pos_before_.end(), cache.pos, cache.pos + b);
  }
  const uint64_t step = ++step_;
  last_launches_ = static_cast<uint32_t>(launch_end_.size());
  absl::Status status;
  for (size_t L = 0, begin = 0; L < launch_end_.size() && status.ok(); begin = launch_end_[L++]) {
    const auto count = static_cast<uint32_t>(launch_end_[L] - begin);
    status = runner_(*compute_, geometry_, queries_ + begin, count, step, scratch_ + begin * stride_, stride_,
                     results_ + begin, host_base_, pool_base_);
  }
  if (absl::Status s = compute_->Synchronize(); status.ok()) status = s;
  if (!status.ok()) InvalidateClaimed(group);
  return status;
}

// Every hot slot of the batch's request slots whose row changed since Launch's snapshot (a victim claimed for a miss)
// is emptied: Resolver's contract after an error.
void KernelResolver::InvalidateClaimed(uint32_t group) {
  for (size_t i = 0; i < before_slots_.size(); ++i) {
    const plan::HotSlots cache = View(group, before_slots_[i]);
    for (uint32_t h = 0; h < hot_rows_; ++h) {
      if (cache.pos[h] != pos_before_[i * hot_rows_ + h]) cache.pos[h] = plan::kNone;
    }
  }
}

// Step 4: the first query in batch order with a planning error fails the batch; else the outputs and the census.
absl::Status KernelResolver::Collect(uint32_t group, std::span<ResolveQuery> batch) {
  const size_t n = batch.size();
  for (size_t i = 0; i < n; ++i) {  // batch order
    const size_t a = static_cast<size_t>(std::find(order_.begin(), order_.end(), i) - order_.begin());
    const int32_t e = results_[a].error;
    if (e == plan::kOk) continue;
    InvalidateClaimed(group);
    if (e == plan::kErrNoCopy) {
      return absl::InternalError(absl::StrCat("resolver: request ", batch[i].kv->id,
                                              " selects a row that is neither ready on GPU nor backed up on host"));
    }
    return absl::ResourceExhaustedError(absl::StrCat("resolver: request ", batch[i].kv->id,
                                                     ": more distinct missing rows than unprotected hot slots"));
  }
  Census add;
  for (size_t a = 0; a < n; ++a) {
    const ResolveQuery& q = batch[order_[a]];
    std::memcpy(q.out.data(), queries_[a].out, q.out.size() * sizeof(Location));
    const plan::QueryResult& r = results_[a];
    add += Census{r.direct, r.hot, r.host, r.scans_skipped, r.bytes_recovered};
  }
  census_[group] += add;
  return absl::OkStatus();
}

}  // namespace dhs
