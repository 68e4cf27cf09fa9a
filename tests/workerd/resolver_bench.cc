// tests/workerd/resolver_bench.cc: figures for the fused resolver (brief §5). Prints, asserts nothing about time.
//
// 1. BM_PlanStep/<history rows>: the resolver's own work per step (FusedResolver::Plan: validation, direct lookups in
//    the tail / ready map, hot-cache hits and LRU victim choice) against the size of the optional history, at a FIXED
//    composition of every step: kDirect rows resolved directly (random over the whole ready map), kHot hot-cache hits
//    (the previous step's misses) and kHost misses (fresh rows of a fixed host-only region). The host copies run in
//    Finish, outside the timed region. Brief §5: this cost is bounded by B and k, so it must be flat in the history.
//    BM_ResolveStep/<history rows>: the whole Resolve (plan + one copy batch of kHost rows + wait), same composition;
//    the host rows come from the same small region at every size, so the copy work is held constant. On CpuDevice
//    this includes the copy thread's wake-up and the event wait, which depend on the machine's load.
//    BM_PlanStepInterleaved/<direct window>: every history size in one run, in alternating blocks of steps, so all
//    sizes see the same load; counters ns_per_step_<rows> and max_over_min (window 0: whole ready map; 4096: fixed).
//    BM_PlanStepFixedWindow/<history rows>: a diagnostic, as BM_PlanStep but the direct rows come from a fixed window
//    of 4096 ready rows at every size, so the same lookups touch a ready-map region of fixed size.
//    Counters: ns_per_step, ns_per_row (per selected row), thread_cpu_ns_per_step (the stepping thread's CPU time:
//    on a loaded machine a thread that never sleeps is preempted inside the timed region, one that sleeps in waits
//    is favoured by the scheduler, so compare both figures), the per-step census (direct/hot/host) measured from the
//    resolver's census, hot_index_KiB (the dense ready_page + host_ready index the lookups read, request_kv.h) and
//    page_record_KiB (the KvPage record beside it, not read by the lookups). The composition is checked against the
//    census (error otherwise).
// 2. BM_HostRecoveryVsMemcpy/<rows per step>: host recovery of all-miss steps (every selected row copied from the
//    host pool into the hot cache through the device's copy engine) against a plain memcpy of the same rows into the
//    same hot-cache bytes, both timed in the same iterations (order alternated). Counters: recovery_GBps,
//    memcpy_GBps, recovery_vs_memcpy (= recovery bandwidth / memcpy bandwidth), plan_share (share of the recovery
//    time spent in Plan, before any copy is issued), copy_part_vs_memcpy (the rest of the recovery time, issue + copy
//    engine + wait, over the memcpy time), recovery_ns_per_step and memcpy_ns_per_step. At 1 row per step,
//    recovery_ns_per_step is the fixed cost of a step (validation, plan, one copy batch issued and waited).
//    recovery_vs_memcpy_cpu: the same ratio from the process's CPU time (all threads), for loaded machines.
// 3. BM_HostRecoveryVerified/<rows per step>/<mode>: host-page integrity (issue 22) on the recovery path, the same
//    all-miss steps as (2) with the resolver's page verifier (ResolverEnv.verify_host_page, as HierarchicalKvAccess
//    sets it: XXH3-64 of the whole host page against its recorded checksum, common/page_checksum.h). mode 0: no
//    verifier (the baseline); 1: cached, each page verified at its first recovery and never again (the worker's
//    design: in steady state only the per-miss flag check remains); 2: every page a step recovers from is verified
//    in that step (flags cleared before each step: the cost of a page's first recovery, or of verifying once per
//    page per batch). Counters: ns_per_step, verify_ns_per_row (mode minus the baseline of the same rows, per
//    recovered row), pages_verified_per_step, page_bytes. Rows are consecutive, so a step of r rows verifies
//    ceil(r / p) pages (p = 64): at 1 row per step every row pays a whole page's hash (the worst case).
// After all benchmarks a summary prints the median ns_per_step per history size, max/min across sizes, and the
// bandwidth ratios. Step benchmarks run 3 repetitions (the summary takes the median).
//
// Set-up note: the request's state (ready map, host copies) is written directly, as the access layer would leave it.
// Ready pages alias onto kDevicePages device pages: the resolver only computes their locations (it never reads their
// bytes), so the device pool stays small while the ready map has one entry per history page.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/page_checksum.h"
#include "workerd/device/cpu_device.h"
#include "workerd/kv/layout.h"
#include "workerd/kv/request_kv.h"
#include "workerd/kv/resolver.h"

namespace dhs {
namespace {

using Clock = std::chrono::steady_clock;

double ProcessCpuSeconds() {  // every thread of the process (the device's copy thread included)
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

constexpr uint32_t kK = 64, kB = 256, kP = 64;
constexpr uint64_t kRowBytes = 576;  // d_KV of the glm5-like preset (brief §8)
// Fixed composition of every step (sums to k).
constexpr uint32_t kDirect = 32, kHot = 16, kHost = 16;
static_assert(kDirect + kHot + kHost == kK);
// Host-only region: pages [0, kHostPages). Misses cycle through its rows, kHost per step: a row comes back after
// kHostPages * kP / kHost = 32 steps, while the LRU drops an untouched row after about (B - 2 * kHost) / kHost + 1 =
// 15 steps, so every cycled row is a real miss and every previous-step row a real hit (checked with the census).
constexpr uint32_t kHostPages = 8;
constexpr uint32_t kDevicePages = 64;
constexpr int kWarmupSteps = 64;

// Figures kept for the summary printed after all benchmarks. Per benchmark instance, only the runs with the most
// iterations count (the runner's short trial runs are dropped); the summary takes their median.
struct Samples {
  uint64_t iterations = 0;
  std::vector<double> values;
  void Add(uint64_t iters, double v) {
    if (iters > iterations) {
      iterations = iters;
      values.clear();
    }
    if (iters == iterations) values.push_back(v);
  }
  double Median() const {
    std::vector<double> v = values;
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
  }
};
std::map<std::string, std::map<int64_t, Samples>>& StepFigures() {
  static std::map<std::string, std::map<int64_t, Samples>> m;
  return m;
}
std::map<int64_t, std::pair<double, double>>& BandwidthFigures() {  // rows per step -> (recovery, memcpy) GB/s
  static std::map<int64_t, std::pair<double, double>> m;
  return m;
}

std::map<int64_t, double>& CpuRatios() {  // rows per step -> memcpy CPU time / recovery CPU time
  static std::map<int64_t, double> m;
  return m;
}
std::map<int64_t, std::pair<double, double>>& StepNs() {  // rows per step -> (recovery, memcpy) ns per step
  static std::map<int64_t, std::pair<double, double>> m;
  return m;
}

KvConfig Config(uint32_t hot_rows, uint32_t k, uint32_t optional_pages) {
  KvConfig c;
  c.row_bytes = {kRowBytes};
  c.groups = {{0}};
  c.page_rows = kP;
  c.hot_rows = hot_rows;
  c.k = k;
  c.tail_rows = kP;
  c.slots = 1;
  c.optional_pages = optional_pages;
  return c;
}

// One request with `rows` rows of history: pages below host_pages have a host copy only; every other page is ready
// optional history (aliased onto kDevicePages device pages). The last page is also in the tail.
struct Bench {
  Bench(Position rows, uint32_t hot_rows, uint32_t k, uint32_t host_pages)
      : layout(*KvLayout::Create(Config(hot_rows, k, kDevicePages))),
        host(uint64_t{host_pages} * layout.page_bytes()),
        pool(*device.AllocatePool(layout.pool_bytes())),
        resolver(ResolverEnv{&layout, &device, pool, host, {}}) {
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 131 + 7);
    const uint32_t pages = static_cast<uint32_t>(rows / kP);
    kv.id = 1;
    kv.appended = {rows};
    kv.tail_write.assign(1, std::vector<CopyEvent>(kP));
    kv.pages.resize(pages);
    for (uint32_t p = 0; p < pages; ++p) {
      if (p < host_pages) {
        kv.pages[p].host_page = p;
        kv.pages[p].host = HostCopy::kWritten;
      } else {
        kv.pages[p].device_page = p % kDevicePages;
        kv.pages[p].gpu = GpuCopy::kReady;
      }
    }
  }

  CpuDevice device;
  KvLayout layout;
  std::vector<uint8_t> host;
  PoolId pool;
  FusedResolver resolver;
  RequestKv kv;
  const std::vector<SourceId> sources = {0};
};

// The selection of step `step`: kHost fresh host rows, kHot rows missed in the previous step, kDirect distinct
// random rows of the ready region (the first `direct_window` rows of it, or all of it when 0); shuffled.
void MakeSelection(uint64_t step, Position rows, Position direct_window, std::mt19937_64& rng,
                   std::vector<Position>& sel) {
  constexpr Position kRegion = Position{kHostPages} * kP;
  sel.clear();
  for (uint32_t i = 0; i < kHost; ++i) sel.push_back(static_cast<Position>((step * kHost + i) % kRegion));
  for (uint32_t i = 0; i < kHot; ++i) sel.push_back(static_cast<Position>(((step - 1) * kHost + i) % kRegion));
  const Position ready = rows - kRegion;
  const uint64_t span = static_cast<uint64_t>(direct_window > 0 ? std::min(direct_window, ready) : ready);
  while (sel.size() < kK) {
    const Position t = kRegion + static_cast<Position>(rng() % span);
    if (std::find(sel.begin() + kHost + kHot, sel.end(), t) == sel.end()) sel.push_back(t);
  }
  std::shuffle(sel.begin(), sel.end(), rng);
}

// One request stepped at the fixed composition. plan_only: Step times Plan alone (the copies are issued and waited
// in Finish, untimed); otherwise it times the whole Resolve. direct_window > 0: the direct rows come from the first
// direct_window ready rows only (a diagnostic: the same lookups on a ready-map region of fixed size).
class StepLane {
 public:
  StepLane(Position rows, bool plan_only, Position direct_window)
      : rows_(rows), plan_only_(plan_only), window_(direct_window), b_(rows, kB, kK, kHostPages), out_(kK) {
    sel_.reserve(kK);
    for (int i = 0; i < kWarmupSteps; ++i) (void)Step();
    before_ = b_.resolver.census(0);
    steps_ = 0;
  }
  // One step; returns its timed seconds, or a negative value when the resolver failed.
  double Step() {
    MakeSelection(next_++, rows_, window_, rng_, sel_);
    ResolveQuery q{&b_.kv, sel_, out_};
    const double cpu0 = ThreadCpuSeconds();
    const Clock::time_point t0 = Clock::now();
    double sec, cpu;
    absl::Status s;
    if (plan_only_) {
      absl::StatusOr<PlannedBatchPtr> plan = b_.resolver.Plan(0, b_.sources, {&q, 1});
      sec = std::chrono::duration<double>(Clock::now() - t0).count();
      cpu = ThreadCpuSeconds() - cpu0;
      s = plan.ok() ? b_.resolver.Finish(*std::move(plan)) : plan.status();
    } else {
      s = b_.resolver.Resolve(0, b_.sources, {&q, 1});
      sec = std::chrono::duration<double>(Clock::now() - t0).count();
      cpu = ThreadCpuSeconds() - cpu0;
    }
    ++steps_;
    total_sec_ += sec;
    total_cpu_sec_ += cpu;
    return s.ok() ? sec : -1;
  }
  // True when every timed step resolved exactly kDirect / kHot / kHost rows (from the resolver's census).
  bool CompositionOk() const {
    const Census& c = b_.resolver.census(0);
    return c.direct - before_.direct == steps_ * kDirect && c.hot - before_.hot == steps_ * kHot &&
           c.host - before_.host == steps_ * kHost;
  }
  // Selected rows per timed step that resolved direct / hot / host.
  double PerStep(uint64_t Census::*field) const {
    return steps_ == 0 ? 0 : static_cast<double>(b_.resolver.census(0).*field - before_.*field) / steps_;
  }
  double ns_per_step() const { return steps_ == 0 ? 0 : total_sec_ * 1e9 / static_cast<double>(steps_); }
  // The calling thread's CPU time per step (excludes time preempted by other processes on a loaded machine, and
  // the copy thread's work when copies run there).
  double cpu_ns_per_step() const { return steps_ == 0 ? 0 : total_cpu_sec_ * 1e9 / static_cast<double>(steps_); }
  // The dense hot index the resolver's lookups read (request_kv.h: ready_page, 4 B, and host_ready, 1 B, per page),
  // and the per-page record beside it (KvPage) that they no longer read.
  double hot_index_kib() const {
    const RequestKv& kv = b_.kv;
    return static_cast<double>(kv.ready_page.size() * sizeof(kv.ready_page[0]) +
                               kv.host_ready.size() * sizeof(kv.host_ready[0])) / 1024.0;
  }
  double page_record_kib() const { return static_cast<double>(b_.kv.pages.size() * sizeof(KvPage)) / 1024.0; }
  Position rows() const { return rows_; }

 private:
  Position rows_;
  bool plan_only_;
  Position window_;
  Bench b_;
  std::mt19937_64 rng_{7};
  std::vector<Position> sel_;
  std::vector<Location> out_;
  uint64_t next_ = 1;
  uint64_t steps_ = 0;
  double total_sec_ = 0;
  double total_cpu_sec_ = 0;
  Census before_;
};

void RunStep(benchmark::State& state, bool plan_only, Position direct_window, const char* name) {
  StepLane lane(state.range(0), plan_only, direct_window);
  for (auto _ : state) {
    const double sec = lane.Step();
    if (sec < 0) {
      state.SkipWithError("resolver failed");
      break;
    }
    state.SetIterationTime(sec);
  }
  if (!lane.CompositionOk()) {
    state.SkipWithError("step composition differs from the intended direct/hot/host split");
    return;
  }
  state.counters["ns_per_step"] = lane.ns_per_step();
  state.counters["ns_per_row"] = lane.ns_per_step() / kK;
  state.counters["thread_cpu_ns_per_step"] = lane.cpu_ns_per_step();
  state.counters["direct"] = lane.PerStep(&Census::direct);
  state.counters["hot"] = lane.PerStep(&Census::hot);
  state.counters["host"] = lane.PerStep(&Census::host);
  state.counters["hot_index_KiB"] = lane.hot_index_kib();
  state.counters["page_record_KiB"] = lane.page_record_kib();
  StepFigures()[name][lane.rows()].Add(state.iterations(), lane.ns_per_step());
  StepFigures()[std::string(name) + " thread_cpu"][lane.rows()].Add(state.iterations(), lane.cpu_ns_per_step());
}

void BM_PlanStep(benchmark::State& state) { RunStep(state, true, 0, "BM_PlanStep"); }
void BM_ResolveStep(benchmark::State& state) { RunStep(state, false, 0, "BM_ResolveStep"); }
// Diagnostic: direct rows from a fixed window of 4096 ready rows (64 ready-map entries) at every history size.
void BM_PlanStepFixedWindow(benchmark::State& state) { RunStep(state, true, 4096, "BM_PlanStepFixedWindow"); }

void HistorySizes(benchmark::internal::Benchmark* b) {
  for (int64_t rows : {int64_t{1} << 10, int64_t{1} << 12, int64_t{1} << 15, int64_t{1} << 18, int64_t{1} << 20}) {
    b->Arg(rows);
  }
  b->UseManualTime()->Unit(benchmark::kNanosecond)->MinTime(0.2)->Repetitions(3);
}
BENCHMARK(BM_PlanStep)->Apply(HistorySizes);

// All five history sizes in one run, in blocks of kBlock steps per size with a rotating order, so that they share
// the same machine load (the 2-core machine is shared): the flatness figure least disturbed by load drift.
// Counters: ns_per_step_<rows> per history size and max_over_min across sizes.
void BM_PlanStepInterleaved(benchmark::State& state) {
  constexpr int kBlock = 256;
  std::vector<std::unique_ptr<StepLane>> lanes;
  for (int64_t rows : {int64_t{1} << 10, int64_t{1} << 12, int64_t{1} << 15, int64_t{1} << 18, int64_t{1} << 20}) {
    lanes.push_back(std::make_unique<StepLane>(rows, true, state.range(0)));
  }
  size_t rot = 0;
  for (auto _ : state) {
    double sec = 0;
    for (size_t i = 0; i < lanes.size(); ++i) {
      StepLane& lane = *lanes[(i + rot) % lanes.size()];
      for (int j = 0; j < kBlock; ++j) {
        const double s = lane.Step();
        if (s < 0) state.SkipWithError("resolver failed");
        sec += s;
      }
    }
    ++rot;
    state.SetIterationTime(sec);
  }
  double lo = 0, hi = 0;
  for (const auto& lane : lanes) {
    if (!lane->CompositionOk()) {
      state.SkipWithError("step composition differs from the intended direct/hot/host split");
      return;
    }
    const double ns = lane->ns_per_step();
    state.counters["ns_per_step_" + std::to_string(lane->rows())] = ns;
    lo = lo == 0 ? ns : std::min(lo, ns);
    hi = std::max(hi, ns);
    StepFigures()[state.range(0) == 0 ? "BM_PlanStepInterleaved" : "BM_PlanStepInterleavedFixedWindow"][lane->rows()]
        .Add(state.iterations(), ns);
  }
  state.counters["max_over_min"] = lo > 0 ? hi / lo : 0;
}
// Arg: direct window (0 = the whole ready map; 4096 = the fixed-window diagnostic, see StepLane).
BENCHMARK(BM_PlanStepInterleaved)->Arg(0)->Arg(4096)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_PlanStepFixedWindow)->Apply(HistorySizes);
BENCHMARK(BM_ResolveStep)->Apply(HistorySizes);

// Host recovery of `k` rows per step, all misses (B = k), against memcpy of the same rows into the same hot rows.
void BM_HostRecoveryVsMemcpy(benchmark::State& state) {
  const uint32_t k = static_cast<uint32_t>(state.range(0));
  constexpr uint32_t kPages = 64;  // host region: 4096 rows, 2.25 MiB
  const Position region = Position{kPages} * kP;
  Bench b(region + kP, k, k, kPages);  // one more page: the tail
  std::vector<Position> sel(k);
  std::vector<Location> out(k);
  uint8_t* pool_base = b.device.HostVisible(b.pool, 0);
  Position next = 0;
  double rec_sec = 0, cpy_sec = 0, plan_sec = 0, rec_cpu = 0, cpy_cpu = 0;
  uint64_t iter = 0;
  const Census before = b.resolver.census(0);
  for (auto _ : state) {
    for (auto& t : sel) t = (next++) % region;  // consecutive rows; the previous step's k rows are all evicted
    auto recover = [&] {
      ResolveQuery q{&b.kv, sel, out};
      const double c0 = ProcessCpuSeconds();
      const Clock::time_point t0 = Clock::now();
      absl::StatusOr<PlannedBatchPtr> plan = b.resolver.Plan(0, b.sources, {&q, 1});  // = Resolve, split in two
      const Clock::time_point t1 = Clock::now();
      const absl::Status s = plan.ok() ? b.resolver.Finish(*std::move(plan)) : plan.status();
      const Clock::time_point t2 = Clock::now();
      rec_cpu += ProcessCpuSeconds() - c0;
      rec_sec += std::chrono::duration<double>(t2 - t0).count();
      plan_sec += std::chrono::duration<double>(t1 - t0).count();
      if (!s.ok()) state.SkipWithError("resolve failed");
    };
    auto copy = [&] {
      const double c0 = ProcessCpuSeconds();
      const Clock::time_point t0 = Clock::now();
      for (uint32_t j = 0; j < k; ++j) {
        const Position t = sel[j];
        std::memcpy(pool_base + b.layout.HotRow(0, 0, j),
                    b.host.data() + static_cast<uint64_t>(t / kP) * b.layout.page_bytes() +
                        b.layout.InPage(0, static_cast<uint32_t>(t % kP)),
                    kRowBytes);
      }
      benchmark::ClobberMemory();
      cpy_sec += std::chrono::duration<double>(Clock::now() - t0).count();
      cpy_cpu += ProcessCpuSeconds() - c0;
    };
    if (iter++ % 2 == 0) {
      recover();
      copy();
    } else {
      copy();
      recover();
    }
  }
  const uint64_t n = state.iterations();
  if (b.resolver.census(0).host - before.host != n * k) {
    state.SkipWithError("not every selected row was a host recovery");
    return;
  }
  const double bytes = static_cast<double>(n) * k * kRowBytes;
  const double rec = rec_sec > 0 ? bytes / rec_sec / 1e9 : 0, cpy = cpy_sec > 0 ? bytes / cpy_sec / 1e9 : 0;
  state.counters["recovery_GBps"] = rec;
  state.counters["memcpy_GBps"] = cpy;
  state.counters["recovery_vs_memcpy"] = cpy > 0 ? rec / cpy : 0;
  state.counters["plan_share"] = rec_sec > 0 ? plan_sec / rec_sec : 0;  // of the recovery time: Plan (no copy)
  // The rest of the recovery (issue, copy engine, wait) against memcpy of the same bytes: >1 = slower than memcpy.
  state.counters["copy_part_vs_memcpy"] = cpy_sec > 0 ? (rec_sec - plan_sec) / cpy_sec : 0;
  // The same ratio from the process's CPU time (all threads): not inflated by preemption on a loaded machine, where
  // a thread that never sleeps loses time slices inside either timed region. Each region includes two
  // clock_gettime(CLOCK_PROCESS_CPUTIME_ID) calls (a system call, ~0.1-0.5 us): meaningful from tens of us per step.
  state.counters["recovery_vs_memcpy_cpu"] = rec_cpu > 0 ? cpy_cpu / rec_cpu : 0;
  CpuRatios()[k] = rec_cpu > 0 ? cpy_cpu / rec_cpu : 0;
  state.counters["recovery_ns_per_step"] = rec_sec * 1e9 / static_cast<double>(n);  // at 1 row: the fixed cost
  state.counters["memcpy_ns_per_step"] = cpy_sec * 1e9 / static_cast<double>(n);
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  BandwidthFigures()[k] = {rec, cpy};
  StepNs()[k] = {rec_sec * 1e9 / static_cast<double>(n), cpy_sec * 1e9 / static_cast<double>(n)};
}
// 1 row per step: the fixed cost of a recovery step (recovery_ns_per_step); 64 (= k) and 2048: the ratios.
BENCHMARK(BM_HostRecoveryVsMemcpy)->Arg(1)->Arg(kK)->Arg(2048)->Unit(benchmark::kMicrosecond)->UseRealTime();

// Host recovery with the page verifier (see 3. at the top): mode 0 none, 1 cached, 2 every page of every step.
std::map<int64_t, std::map<int64_t, double>>& VerifyNs() {  // rows per step -> mode -> ns per step
  static std::map<int64_t, std::map<int64_t, double>> m;
  return m;
}
void BM_HostRecoveryVerified(benchmark::State& state) {
  const uint32_t k = static_cast<uint32_t>(state.range(0));
  const int64_t mode = state.range(1);
  constexpr uint32_t kPages = 64;
  const Position region = Position{kPages} * kP;
  Bench b(region + kP, k, k, kPages);
  const uint64_t page_bytes = b.layout.page_bytes();  // host page = GPU page here (no index keys)
  std::vector<uint64_t> sums(kPages);
  for (uint32_t p = 0; p < kPages; ++p) {
    sums[p] = PageChecksum({b.host.data() + uint64_t{p} * page_bytes, page_bytes});
    b.kv.pages[p].checksum = sums[p];
  }
  uint64_t verified = 0;
  std::optional<FusedResolver> verifying;
  if (mode > 0) {
    ResolverEnv env{&b.layout, &b.device, b.pool, b.host, [&](RequestKv& kv, uint32_t page) {
                      KvPage& pg = kv.pages[page];
                      ++verified;
                      if (!PageChecksumMatches({b.host.data() + uint64_t(pg.host_page) * page_bytes, page_bytes},
                                               pg.checksum)) {
                        return absl::DataLossError("bench: page changed");
                      }
                      DHS_CHECK_OK(kv.Transition(page, HostCopy::kWritten, HostCopy::kVerified));
                      return absl::OkStatus();
                    }};
    verifying.emplace(env);
  }
  FusedResolver& resolver = mode > 0 ? *verifying : b.resolver;
  std::vector<Position> sel(k);
  std::vector<Location> out(k);
  Position next = 0;
  double sec = 0;
  for (auto _ : state) {
    for (auto& t : sel) t = (next++) % region;
    if (mode == 2) {
      for (uint32_t p = 0; p < kPages; ++p) b.kv.PlaceHostCopy(p, HostCopy::kWritten, b.kv.pages[p].host_page);
    }
    ResolveQuery q{&b.kv, sel, out};
    const Clock::time_point t0 = Clock::now();
    const absl::Status s = resolver.Resolve(0, b.sources, {&q, 1});
    sec += std::chrono::duration<double>(Clock::now() - t0).count();
    if (!s.ok()) state.SkipWithError("resolve failed");
  }
  const double n = static_cast<double>(state.iterations());
  const double ns = sec * 1e9 / n;
  state.counters["ns_per_step"] = ns;
  state.counters["pages_verified_per_step"] = static_cast<double>(verified) / n;
  state.counters["page_bytes"] = static_cast<double>(page_bytes);
  VerifyNs()[k][mode] = ns;
  if (mode > 0 && VerifyNs()[k].contains(0)) state.counters["verify_ns_per_row"] = (ns - VerifyNs()[k][0]) / k;
}
BENCHMARK(BM_HostRecoveryVerified)
    ->ArgsProduct({{1, kK, 2048}, {0, 1, 2}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void PrintSummary() {
  for (const auto& [name, by_rows] : StepFigures()) {
    std::map<int64_t, double> med;
    for (const auto& [rows, samples] : by_rows) med[rows] = samples.Median();
    if (med.empty()) continue;
    auto lo = med.begin(), hi = med.begin();
    std::string all;
    for (auto it = med.begin(); it != med.end(); ++it) {
      if (it->second < lo->second) lo = it;
      if (it->second > hi->second) hi = it;
      char buf[64];
      std::snprintf(buf, sizeof buf, " %lld:%.0f", static_cast<long long>(it->first), it->second);
      all += buf;
    }
    std::printf("summary %s ns_per_step (median) by history rows:%s\n", name.c_str(), all.c_str());
    std::printf("summary %s: min %.0f (%lld rows), max %.0f (%lld rows), max/min %.2f over %zu sizes\n",
                name.c_str(), lo->second, static_cast<long long>(lo->first), hi->second,
                static_cast<long long>(hi->first), lo->second > 0 ? hi->second / lo->second : 0.0, med.size());
  }
  for (const auto& [k, bw] : BandwidthFigures()) {
    std::printf("summary host recovery, %lld rows x %llu B per step: %.2f GB/s vs memcpy %.2f GB/s, ratio %.3f\n",
                static_cast<long long>(k), static_cast<unsigned long long>(kRowBytes), bw.first, bw.second,
                bw.second > 0 ? bw.first / bw.second : 0.0);
  }
  for (const auto& [k, r] : CpuRatios()) {
    std::printf("summary host recovery, %lld rows per step: ratio from process CPU time %.3f\n",
                static_cast<long long>(k), r);
  }
  for (const auto& [k, by_mode] : VerifyNs()) {
    if (!by_mode.contains(0) || !by_mode.contains(1) || !by_mode.contains(2)) continue;
    const double off = by_mode.at(0), cached = by_mode.at(1), each = by_mode.at(2);
    std::printf("summary host-page verification, %lld rows per step: %.0f ns per step unverified, %.0f cached "
                "(%+.1f ns per row), %.0f verifying every page of the step (%+.1f ns per row, one %llu-byte page per "
                "%lld rows)\n",
                static_cast<long long>(k), off, cached, (cached - off) / k, each, (each - off) / k,
                static_cast<unsigned long long>(uint64_t{kP} * kRowBytes),
                static_cast<long long>(std::min<int64_t>(k, kP)));
  }
  for (const auto& [k, ns] : StepNs()) {
    std::printf("summary host recovery, %lld rows per step: %.0f ns per step (memcpy of the same rows %.0f ns)\n",
                static_cast<long long>(k), ns.first, ns.second);
  }
}

}  // namespace
}  // namespace dhs

// BENCHMARK_MAIN() plus the cross-benchmark summary.
int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  dhs::PrintSummary();
  benchmark::Shutdown();
  return 0;
}
