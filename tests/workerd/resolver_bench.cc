// tests/workerd/resolver_bench.cc: resolver time per step against the optional-history size (must be flat), and
// host-recovery bandwidth against a plain memcpy of the same bytes (printed as a ratio). Figures only.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>

#include "tests/workerd/kv_test_util.h"

namespace dhs {
namespace {

constexpr uint32_t kK = 64, kB = 256, kP = 64;

KvConfig BenchConfig(uint32_t pages) {
  KvConfig c;
  c.row_bytes = {576};
  c.groups = {{0}};
  c.page_rows = kP;
  c.hot_rows = kB;
  c.k = kK;
  c.tail_rows = kP;
  c.slots = 1;
  c.optional_pages = pages;
  return c;
}

// A request whose whole history (rows) is ready optional history plus host copies (state set up directly; the
// resolver reads it as the access layer would leave it). Each step selects k random rows; 1/4 of the pages are
// not ready, so some rows go through the hot cache / host recovery.
void BM_ResolveStep(benchmark::State& state) {
  const Position rows = state.range(0);
  const uint32_t pages = static_cast<uint32_t>(rows / kP);
  CpuDevice device;
  KvLayout layout = *KvLayout::Create(BenchConfig(pages));
  std::vector<uint8_t> host(uint64_t{pages} * layout.page_bytes());
  PoolId pool = *device.AllocatePool(layout.pool_bytes());
  FusedResolver resolver(ResolverEnv{&layout, &device, pool, host});
  RequestKv kv;
  kv.id = 1;
  kv.appended = {rows};
  kv.tail_write.assign(1, std::vector<CopyEvent>(kP));
  kv.pages.resize(pages);
  for (uint32_t p = 0; p < pages; ++p) {
    kv.pages[p].host_page = p;
    kv.pages[p].host_ready = true;
    if (p % 4 != 0) {
      kv.pages[p].device_page = p;
      kv.pages[p].ready = true;
    }
  }
  std::mt19937_64 rng(7);
  std::vector<Position> sel(kK);
  std::vector<Location> out(kK);
  for (auto _ : state) {
    for (auto& t : sel) t = static_cast<Position>(rng() % static_cast<uint64_t>(rows - kP));
    ResolveQuery q{&kv, sel, out};
    if (!resolver.Resolve(0, std::vector<SourceId>{0}, {&q, 1}).ok()) state.SkipWithError("resolve failed");
  }
  const Census& c = resolver.census(0);
  state.counters["host_frac"] = static_cast<double>(c.host) / static_cast<double>(c.direct + c.hot + c.host);
}
BENCHMARK(BM_ResolveStep)->RangeMultiplier(8)->Range(1 << 10, 1 << 20)->Unit(benchmark::kMicrosecond);

// Host recovery of k rows per step (all misses) vs memcpy of the same bytes.
void BM_HostRecovery(benchmark::State& state) {
  const uint32_t pages = 64;
  const Position rows = Position{pages} * kP;
  CpuDevice device;
  KvConfig cfg = BenchConfig(0);
  cfg.hot_rows = kK;
  KvLayout layout = *KvLayout::Create(cfg);
  std::vector<uint8_t> host(uint64_t{pages} * layout.page_bytes(), 3);
  PoolId pool = *device.AllocatePool(layout.pool_bytes());
  FusedResolver resolver(ResolverEnv{&layout, &device, pool, host});
  RequestKv kv;
  kv.appended = {rows + kP};
  kv.tail_write.assign(1, std::vector<CopyEvent>(kP));
  kv.pages.resize(pages);
  for (uint32_t p = 0; p < pages; ++p) {
    kv.pages[p].host_page = p;
    kv.pages[p].host_ready = true;
  }
  std::vector<Position> sel(kK);
  std::vector<Location> out(kK);
  Position next = 0;
  for (auto _ : state) {
    for (auto& t : sel) t = (next++) % rows;  // never a hit: every row recovered
    ResolveQuery q{&kv, sel, out};
    if (!resolver.Resolve(0, std::vector<SourceId>{0}, {&q, 1}).ok()) state.SkipWithError("resolve failed");
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kK * 576);
}
BENCHMARK(BM_HostRecovery)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_MemcpySameBytes(benchmark::State& state) {
  std::vector<uint8_t> src(64 * kP * 576, 3), dst(kK * 576);
  uint64_t next = 0;
  for (auto _ : state) {
    for (uint32_t j = 0; j < kK; ++j) {
      std::memcpy(dst.data() + j * 576, src.data() + ((next++) % (64 * kP)) * 576, 576);
    }
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * kK * 576);
}
BENCHMARK(BM_MemcpySameBytes)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace
}  // namespace dhs

BENCHMARK_MAIN();
