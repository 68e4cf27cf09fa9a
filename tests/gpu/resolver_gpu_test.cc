// tests/gpu/resolver_gpu_test.cc: the fused resolver kernel (workerd/kv/resolver_kernel.h) against the same code
// run on the host (workerd/kv/resolver_plan.h, itself checked against ReferenceResolver by
// tests/workerd/resolver_plan_test.cc): on the same random inputs, step after step, the device gives the same
// locations, census, hot-cache state and KV-pool bytes (the whole pool, host recovery read from the mapped pinned
// host pool), and the recovered rows equal the original rows. Exits 77 (skipped) without a GPU.
#include <gtest/gtest.h>

#include <cstring>

#include "tests/gpu/gpu_util.h"
#include "tests/workerd/resolver_plan_scenario.h"

namespace dhs {
namespace {

using gpu::DevArray;
using test::PlanScenario;
using test::PlanScenarioParams;

void RunDeviceAgainstHost(uint64_t seed, const PlanScenarioParams& params, int steps, uint32_t threads) {
  PlanScenario sc(seed, params);
  const KvLayout& l = *sc.layout;
  auto dev = CudaDevice::Create();
  ASSERT_TRUE(dev.ok()) << dev.status();
  CudaDevice& d = **dev;
  const PoolId pool = *d.AllocatePool(l.pool_bytes());
  absl::StatusOr<uint8_t*> host_dev = d.RegisterHostPool(std::span<uint8_t>(sc.host_pool));
  ASSERT_TRUE(host_dev.ok()) << host_dev.status();
  struct Unregister {  // also when an ASSERT returns early
    CudaDevice& d;
    std::span<uint8_t> host;
    ~Unregister() { EXPECT_TRUE(d.UnregisterHostPool(host).ok()); }
  } unregister{d, std::span<uint8_t>(sc.host_pool)};
  std::vector<uint8_t> host_plan_pool(l.pool_bytes(), 0);
  std::vector<plan::HotSlotsStorage> caches;
  std::vector<std::unique_ptr<gpu::DeviceHotSlots>> dcaches;
  std::vector<std::unique_ptr<plan::GeometryStorage>> geo;
  std::vector<std::unique_ptr<gpu::DeviceGeometry>> dgeo;
  for (const auto& gs : sc.config.groups) {
    caches.emplace_back(sc.config.slots, sc.config.hot_rows);
    dcaches.push_back(std::make_unique<gpu::DeviceHotSlots>(caches.back()));
    geo.push_back(std::make_unique<plan::GeometryStorage>(l, gs));
    dgeo.push_back(std::make_unique<gpu::DeviceGeometry>(*geo.back()));
  }
  std::vector<std::unique_ptr<gpu::DeviceRequest>> dreq;
  std::vector<const gpu::DeviceRequest*> dreq_ptr;
  for (size_t i = 0; i < sc.kvs.size(); ++i) {
    dreq.push_back(std::make_unique<gpu::DeviceRequest>(sc.kvs[i], sc.host_pages[i]));
    dreq_ptr.push_back(dreq.back().get());
  }
  uint64_t host_rows = 0, hot_rows = 0;
  for (int step = 1; step <= steps; ++step) {
    const uint32_t group = static_cast<uint32_t>(step % sc.config.groups.size());
    const auto& gs = sc.config.groups[group];
    const auto sel = sc.NextSelections(group);
    const size_t n = sc.kvs.size(), k = sc.config.k, ns = gs.size();
    std::vector<std::vector<Location>> out(n, std::vector<Location>(ns * k));
    std::vector<plan::Query> queries;
    for (size_t i = 0; i < n; ++i) {
      queries.push_back(plan::MakeQuery(sc.kvs[i], gs, sc.config.tail_rows, sc.host_pages[i], sel[i], out[i],
                                        caches[group].View(sc.kvs[i].slot)));
    }
    gpu::DeviceBatch batch(geo[group]->g, queries, dreq_ptr, *dcaches[group]);
    std::vector<plan::QueryResult> want(n);
    ASSERT_EQ(plan::RunPlanHost(geo[group]->g, queries, step, want, sc.host_pool.data(), host_plan_pool.data()),
              plan::kOk);
    ASSERT_EQ(batch.Launch(dgeo[group]->g, step, *host_dev, d.DevicePointer(pool, 0), d.compute_stream(), threads),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(d.compute_stream()), cudaSuccess);
    const std::vector<plan::QueryResult> got = batch.results.Download();
    const std::vector<int64_t> got_out = batch.outs.Download();
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(got[i].error, plan::kOk);
      EXPECT_EQ(got[i].direct, want[i].direct) << "step " << step << " query " << i;
      EXPECT_EQ(got[i].hot, want[i].hot) << "step " << step << " query " << i;
      EXPECT_EQ(got[i].host, want[i].host) << "step " << step << " query " << i;
      EXPECT_EQ(got[i].scans_skipped, want[i].scans_skipped);
      EXPECT_EQ(got[i].bytes_recovered, want[i].bytes_recovered);
      host_rows += want[i].host;
      hot_rows += want[i].hot;
      ASSERT_TRUE(std::equal(out[i].begin(), out[i].end(), got_out.begin() + i * ns * k))
          << "locations differ, step " << step << " query " << i;
    }
    EXPECT_EQ(dcaches[group]->pos.Download(), caches[group].pos) << "step " << step;
    EXPECT_EQ(dcaches[group]->last_use.Download(), caches[group].last_use) << "step " << step;
    EXPECT_EQ(dcaches[group]->stamp.Download(), caches[group].stamp) << "step " << step;
    EXPECT_EQ(dcaches[group]->clock.Download(), caches[group].clock) << "step " << step;
    // The device pool, read back through the device's own copy path, equals the host plan's pool byte for byte.
    std::vector<uint8_t> pool_bytes(l.pool_bytes());
    DeviceToHostCopy op{pool_bytes.data(), DeviceRange{pool, 0, l.pool_bytes()}};
    ASSERT_TRUE(d.CopyDeviceToHost({&op, 1}, {}).Wait().ok());
    ASSERT_EQ(pool_bytes, host_plan_pool) << "pool bytes differ after step " << step;
    // And every recovered row is the original row (independent of both).
    for (size_t i = 0; i < n; ++i) {
      for (size_t si = 0; si < ns; ++si) {
        for (size_t j = 0; j < k; ++j) {
          const Location loc = out[i][si * k + j];
          if (sel[i][j] < 0 || !sc.IsHotRow(sc.kvs[i].slot, gs[si], loc)) continue;
          ASSERT_EQ(std::memcmp(pool_bytes.data() + loc, sc.HostRow(i, gs[si], sel[i][j]), l.row_bytes(gs[si])), 0);
        }
      }
    }
  }
  EXPECT_GT(host_rows, 0u);
  EXPECT_GT(hot_rows, 0u);
}

TEST(ResolverGpu, SameAsHostSmall) {
  for (uint64_t seed = 1; seed <= 4; ++seed) RunDeviceAgainstHost(seed, PlanScenarioParams{}, 30, seed % 2 ? 1024 : 256);
}

TEST(ResolverGpu, SameAsHostOddSizesFewThreads) {
  PlanScenarioParams p;
  p.row_bytes = {17, 33};
  p.groups = {{0, 1}};
  p.hot_rows = 13;
  p.k = 13;
  p.repeat_share = 0.7;
  RunDeviceAgainstHost(11, p, 40, 32);
}

TEST(ResolverGpu, SameAsHostGlm5Like) {
  PlanScenarioParams p;  // brief §8 glm5-like shapes, scaled down in B and k to keep the host side quick
  p.row_bytes = {576, 576, 576, 576};
  p.groups = {{0, 1, 2, 3}};
  p.page_rows = 64;
  p.tail_rows = 64;
  p.hot_rows = 1024;
  p.k = 512;
  p.slots = 8;
  p.optional_pages = 64;
  p.min_history = 2000;
  p.max_history = 6000;
  RunDeviceAgainstHost(21, p, 8, 1024);
}

}  // namespace
}  // namespace dhs

int main(int argc, char** argv) {
  dhs::gpu::ExitUnlessGpu("resolver_gpu_test");
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
