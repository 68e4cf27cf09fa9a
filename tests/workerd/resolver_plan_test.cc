// tests/workerd/resolver_plan_test.cc: the shared plan and gather (workerd/kv/resolver_plan.h), compiled for the host,
// against ReferenceResolver on the same random inputs, step after step: the same locations, the same census, and the
// hot-cache bytes it gathered equal to the original rows of the host pool (read independently of both resolvers).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tests/workerd/resolver_plan_scenario.h"
#include "workerd/device/cpu_device.h"
#include "workerd/kv/resolver.h"
#include "workerd/kv/resolver_plan_host.h"

namespace dhs {
namespace {

using test::PlanScenario;
using test::PlanScenarioParams;

Census Sum(const std::vector<plan::QueryResult>& r) {
  Census c;
  for (const auto& x : r) {
    c.direct += x.direct;
    c.hot += x.hot;
    c.host += x.host;
    c.scans_skipped += x.scans_skipped;
    c.bytes_recovered += x.bytes_recovered;
  }
  return c;
}
Census Minus(const Census& a, const Census& b) {
  return Census{a.direct - b.direct, a.hot - b.hot, a.host - b.host, a.scans_skipped - b.scans_skipped,
                a.bytes_recovered - b.bytes_recovered};
}

// Runs `steps` batches (every request of one group per batch, groups in turn) through ReferenceResolver and the
// shared plan; checks every step. *total: the census totals of the plan.
void RunAgainstReference(uint64_t seed, const PlanScenarioParams& params, int steps, Census* total_out) {
  PlanScenario sc(seed, params);
  const KvLayout& l = *sc.layout;
  CpuDevice device;
  const PoolId pool = *device.AllocatePool(l.pool_bytes());
  ReferenceResolver ref(ResolverEnv{&l, &device, pool, std::span<uint8_t>(sc.host_pool), {}});
  std::vector<uint8_t> plan_pool(l.pool_bytes(), 0);
  std::vector<plan::HotSlotsStorage> caches;
  for (size_t g = 0; g < sc.config.groups.size(); ++g) caches.emplace_back(sc.config.slots, sc.config.hot_rows);
  std::vector<std::unique_ptr<plan::GeometryStorage>> geo;
  for (const auto& gs : sc.config.groups) geo.push_back(std::make_unique<plan::GeometryStorage>(l, gs));
  std::mt19937_64 rng(seed + 1);
  Census& total = *total_out;
  for (int step = 1; step <= steps; ++step) {
    const uint32_t group = static_cast<uint32_t>(step % sc.config.groups.size());
    const auto& gs = sc.config.groups[group];
    if (step % 7 == 0) {  // a request slot re-admitted: both resolvers empty its hot caches
      const uint32_t slot = static_cast<uint32_t>(rng() % sc.config.slots);
      ref.ResetSlot(slot);
      for (auto& c : caches) c.ResetSlot(slot);
    }
    const auto sel = sc.NextSelections(group);
    const size_t n = sc.kvs.size(), k = sc.config.k, ns = gs.size();
    std::vector<std::vector<Location>> ref_out(n, std::vector<Location>(ns * k)), plan_out = ref_out;
    std::vector<ResolveQuery> batch;
    std::vector<plan::Query> queries;
    for (size_t i = 0; i < n; ++i) {
      batch.push_back(ResolveQuery{&sc.kvs[i], sel[i], ref_out[i]});
      queries.push_back(plan::MakeQuery(sc.kvs[i], gs, sc.config.tail_rows, sc.host_pages[i], sel[i], plan_out[i],
                                        caches[group].View(sc.kvs[i].slot)));
    }
    const Census before = ref.census(group);
    EXPECT_TRUE(ref.Resolve(group, gs, batch).ok());
    std::vector<plan::QueryResult> results(n);
    EXPECT_EQ(plan::RunPlanHost(geo[group]->g, queries, static_cast<uint64_t>(step), results, sc.host_pool.data(),
                                plan_pool.data()),
              plan::kOk);
    const Census got = Sum(results);
    EXPECT_EQ(got, Minus(ref.census(group), before)) << "step " << step;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(plan_out[i], ref_out[i]) << "step " << step << " request " << i;
      for (size_t si = 0; si < ns; ++si) {
        const SourceId s = gs[si];
        for (size_t j = 0; j < k; ++j) {
          const Location loc = plan_out[i][si * k + j];
          if (sel[i][j] == kNoPosition) {
            ASSERT_EQ(loc, kNoLocation);
            continue;
          }
          if (!sc.IsHotRow(sc.kvs[i].slot, s, loc)) continue;
          const uint8_t* want = sc.HostRow(static_cast<uint32_t>(i), s, sel[i][j]);
          ASSERT_NE(want, nullptr);
          ASSERT_EQ(std::memcmp(plan_pool.data() + loc, want, l.row_bytes(s)), 0)
              << "plan's hot row, step " << step << " request " << i << " source " << s << " t " << sel[i][j];
          ASSERT_EQ(std::memcmp(device.HostVisible(pool, loc), want, l.row_bytes(s)), 0)
              << "reference's hot row, step " << step;
        }
      }
    }
    total.direct += got.direct;
    total.hot += got.hot;
    total.host += got.host;
    total.scans_skipped += got.scans_skipped;
    total.bytes_recovered += got.bytes_recovered;
  }
}

TEST(ResolverPlan, MatchesReferenceOnRandomSteps) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    Census c;
    RunAgainstReference(seed, PlanScenarioParams{}, 40, &c);
    // Every path was taken (else the comparison proves little).
    EXPECT_GT(c.direct, 0u);
    EXPECT_GT(c.hot, 0u);
    EXPECT_GT(c.host, 0u);
    EXPECT_GT(c.bytes_recovered, 0u);
  }
}

TEST(ResolverPlan, TightCacheAndOddSizes) {
  PlanScenarioParams p;
  p.row_bytes = {17, 33};
  p.groups = {{0, 1}};
  p.hot_rows = 13;  // B == k, not a power of two: every miss evicts, BPad pads the sort
  p.k = 13;
  p.repeat_share = 0.7;
  Census c;
    RunAgainstReference(11, p, 60, &c);
  EXPECT_GT(c.hot, 0u);
  EXPECT_GT(c.host, 0u);
}

TEST(ResolverPlan, AllDirectSkipsTheScan) {
  PlanScenarioParams p;
  p.ready_share = 1.0;  // every history page ready: nothing reaches the hot cache
  Census c;
    RunAgainstReference(5, p, 10, &c);
  EXPECT_EQ(c.hot, 0u);
  EXPECT_EQ(c.host, 0u);
  EXPECT_EQ(c.scans_skipped, 10u * p.slots);
}

TEST(ResolverPlan, ErrorsAreReported) {
  PlanScenario sc(3, PlanScenarioParams{});
  const auto& gs = sc.config.groups[0];
  plan::GeometryStorage geo(*sc.layout, gs);
  plan::HotSlotsStorage caches(sc.config.slots, sc.config.hot_rows);
  std::vector<uint8_t> pool(sc.layout->pool_bytes());
  RequestKv& kv = sc.kvs[0];
  // Page 0 loses its host copy and is not ready: row 0 has no copy anywhere.
  kv.PlaceGpuCopy(0, GpuCopy::kNone, -1);
  kv.PlaceHostCopy(0, HostCopy::kNone, -1);
  std::vector<Position> sel(sc.config.k, kNoPosition);
  sel[3] = 0;
  std::vector<Location> out(gs.size() * sc.config.k, 12345);
  std::vector<plan::Query> q = {
      plan::MakeQuery(kv, gs, sc.config.tail_rows, sc.host_pages[0], sel, out, caches.View(kv.slot))};
  std::vector<plan::QueryResult> r(1);
  EXPECT_EQ(plan::RunPlanHost(geo.g, q, 1, r, sc.host_pool.data(), pool.data()), plan::kErrNoCopy);
  EXPECT_EQ(out[0], 12345);  // output untouched

  // More distinct misses than unprotected slots: B = k = 24, one slot already protected in this step (as by an
  // earlier query of the same step), 24 distinct fresh rows.
  PlanScenarioParams tight;
  tight.hot_rows = 24;
  tight.k = 24;
  tight.ready_share = 0.0;
  tight.min_history = 200;  // rows 0..23 are history, not tail
  PlanScenario sc2(4, tight);
  plan::GeometryStorage geo2(*sc2.layout, sc2.config.groups[0]);
  plan::HotSlotsStorage c2(sc2.config.slots, sc2.config.hot_rows);
  c2.stamp[0] = 9;  // step 9 protects hot slot 0 of request slot 0: 23 victims for 24 distinct misses
  std::vector<Position> fresh;
  for (Position t = 0; t < 24; ++t) fresh.push_back(t);
  std::vector<Location> out2(sc2.config.groups[0].size() * 24, 777);
  std::vector<plan::Query> q2 = {plan::MakeQuery(sc2.kvs[0], sc2.config.groups[0], sc2.config.tail_rows,
                                                 sc2.host_pages[0], fresh, out2, c2.View(0))};
  std::vector<uint8_t> pool2(sc2.layout->pool_bytes());
  EXPECT_EQ(plan::RunPlanHost(geo2.g, q2, 9, r, sc2.host_pool.data(), pool2.data()), plan::kErrExhausted);
  EXPECT_EQ(out2[0], 777);
}

}  // namespace
}  // namespace dhs
