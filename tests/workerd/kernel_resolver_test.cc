// tests/workerd/kernel_resolver_test.cc: KernelResolver (workerd/kv/kernel_resolver.h), the resolver that runs the
// shared plan behind the device seam (DeviceCompute), on the CPU: a DeviceCompute over a CpuDevice's pools and plain
// host memory, and a PlanRunner that runs the plan with HostLanes (what the CUDA kernel runs, one block per query).
// Against ReferenceResolver on the same random inputs step after step (tests/workerd/resolver_plan_scenario.h): the
// same locations, census and hot-cache rows, the recovered bytes equal to the original rows; batches with a second
// query of a request (two launches, the first one's slots protected in the second); errors (INTERNAL) leave every
// output -1, the census untouched and the same hot-cache rows as the reference; Create's refusals; and
// HierarchicalKvAccess taking it when the device has a compute side and a runner is set (the CPU backend keeps
// FusedResolver). The CUDA runner itself runs in tests/gpu (resolver_gpu_test) on a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "tests/workerd/resolver_plan_scenario.h"
#include "workerd/device/cpu_device.h"
#include "workerd/kv/hierarchical_kv_access.h"
#include "workerd/kv/kernel_resolver.h"
#include "workerd/kv/resolver.h"

namespace dhs {
namespace {

using test::PlanScenario;
using test::PlanScenarioParams;

// A compute side on the host: pool addresses are the CpuDevice's, the "mapped" host pool is the host pool itself,
// shared blocks are calloc'd (counted, so that a leak shows).
class HostCompute final : public DeviceCompute {
 public:
  HostCompute(CpuDevice* device, std::span<uint8_t> host) : device_(device), host_(host) {}
  uint8_t* PoolAddress(PoolId pool, Location offset) const override { return device_->HostVisible(pool, offset); }
  const uint8_t* MappedHostAddress(const uint8_t* host) const override {
    return host >= host_.data() && host < host_.data() + host_.size() ? host : nullptr;
  }
  absl::StatusOr<void*> AllocateShared(uint64_t bytes) override {
    ++blocks;
    return std::calloc(bytes, 1);
  }
  void FreeShared(void* block) override {
    --blocks;
    std::free(block);
  }
  void* ComputeQueue() const override { return nullptr; }
  absl::Status Synchronize() override {
    ++syncs;
    return absl::OkStatus();
  }
  int blocks = 0;
  int syncs = 0;

 private:
  CpuDevice* device_;
  std::span<uint8_t> host_;
};

// The plan of each query in turn with one host lane (RunPlanHost's loop over a launch).
absl::Status HostRunner(DeviceCompute&, const plan::Geometry& g, const plan::Query* queries, uint32_t n, uint64_t step,
                        void* scratch, uint64_t stride, plan::QueryResult* results, const uint8_t* host_pool,
                        uint8_t* pool) {
  for (uint32_t i = 0; i < n; ++i) {
    results[i] = plan::QueryResult{};
    const plan::Scratch s = plan::CarveScratch(static_cast<uint8_t*>(scratch) + i * stride, queries[i].k, g.hot_rows);
    plan::PlanAndGather(plan::HostLanes{}, g, queries[i], step, s, &results[i], host_pool, pool);
  }
  return absl::OkStatus();
}

// Runs `steps` batches (every request of one group, groups in turn; every third step a second query of request 0 that
// selects part of its first query's rows) through ReferenceResolver and KernelResolver; checks every step.
void RunAgainstReference(uint64_t seed, int steps, Census* total) {
  PlanScenario sc(seed, PlanScenarioParams{});
  const KvLayout& l = *sc.layout;
  CpuDevice ref_device, kernel_device;
  const PoolId ref_pool = *ref_device.AllocatePool(l.pool_bytes());
  const PoolId kernel_pool = *kernel_device.AllocatePool(l.pool_bytes());
  ReferenceResolver ref(ResolverEnv{&l, &ref_device, ref_pool, std::span<uint8_t>(sc.host_pool), {}});
  HostCompute compute(&kernel_device, sc.host_pool);
  {
    absl::StatusOr<std::unique_ptr<KernelResolver>> kr = KernelResolver::Create(
        ResolverEnv{&l, &kernel_device, kernel_pool, std::span<uint8_t>(sc.host_pool), {}}, &compute, HostRunner);
    ASSERT_TRUE(kr.ok()) << kr.status();
    KernelResolver& kernel = **kr;
    std::mt19937_64 rng(seed + 1);
    for (int step = 1; step <= steps; ++step) {
      const uint32_t group = static_cast<uint32_t>(step % sc.config.groups.size());
      const auto& gs = sc.config.groups[group];
      if (step % 7 == 0) {  // a request slot re-admitted: both resolvers empty its hot caches
        const auto slot = static_cast<uint32_t>(rng() % sc.config.slots);
        ref.ResetSlot(slot);
        kernel.ResetSlot(slot);
      }
      auto sel = sc.NextSelections(group);
      if (step % 3 == 0) {  // a second query of request 0: half of its first query's entries, the rest -1
        std::vector<Position> again = sel[0];
        for (size_t j = 0; j < again.size(); ++j) again[j] = j % 2 == 0 ? again[j] : kNoPosition;
        sel.push_back(again);
      }
      const size_t n = sel.size(), k = sc.config.k, ns = gs.size();
      std::vector<std::vector<Location>> ref_out(n, std::vector<Location>(ns * k, 7)), kernel_out = ref_out;
      std::vector<ResolveQuery> ref_batch, kernel_batch;
      for (size_t i = 0; i < n; ++i) {
        RequestKv* kv = &sc.kvs[i < sc.kvs.size() ? i : 0];
        ref_batch.push_back(ResolveQuery{kv, sel[i], ref_out[i]});
        kernel_batch.push_back(ResolveQuery{kv, sel[i], kernel_out[i]});
      }
      const Census ref_before = ref.census(group), kernel_before = kernel.census(group);
      ASSERT_TRUE(ref.Resolve(group, gs, ref_batch).ok()) << "step " << step;
      ASSERT_TRUE(kernel.Resolve(group, gs, kernel_batch).ok()) << "step " << step;
      EXPECT_EQ(kernel.last_launches(), n > sc.kvs.size() ? 2u : 1u);
      ASSERT_EQ(kernel.census(group), ref.census(group)) << "step " << step;
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(kernel_out[i], ref_out[i]) << "step " << step << " query " << i;
        const uint32_t r = static_cast<uint32_t>(i < sc.kvs.size() ? i : 0);
        for (size_t si = 0; si < ns; ++si) {
          for (size_t j = 0; j < k; ++j) {
            const Location loc = kernel_out[i][si * k + j];
            if (sel[i][j] == kNoPosition || !sc.IsHotRow(r, gs[si], loc)) continue;
            const uint8_t* want = sc.HostRow(r, gs[si], sel[i][j]);
            ASSERT_NE(want, nullptr);
            ASSERT_EQ(std::memcmp(kernel_device.HostVisible(kernel_pool, loc), want, l.row_bytes(gs[si])), 0)
                << "kernel's hot row, step " << step << " query " << i << " t " << sel[i][j];
          }
        }
      }
      for (uint32_t slot = 0; slot < sc.config.slots; ++slot) {
        for (uint32_t h = 0; h < sc.config.hot_rows; ++h) {
          ASSERT_EQ(kernel.HotPosition(slot, group, h), ref.HotPosition(slot, group, h)) << "step " << step;
        }
      }
      Census d = kernel.census(group);
      d.direct -= kernel_before.direct;
      d.hot -= kernel_before.hot;
      d.host -= kernel_before.host;
      d.scans_skipped -= kernel_before.scans_skipped;
      d.bytes_recovered -= kernel_before.bytes_recovered;
      *total += d;
      (void)ref_before;
    }
    EXPECT_GT(compute.syncs, 0);
  }
  EXPECT_EQ(compute.blocks, 0) << "shared blocks not freed";
}

TEST(KernelResolver, MatchesReferenceOnRandomSteps) {
  Census c;
  for (uint64_t seed = 1; seed <= 4; ++seed) RunAgainstReference(seed, 30, &c);
  EXPECT_GT(c.direct, 0u);  // every path taken
  EXPECT_GT(c.hot, 0u);
  EXPECT_GT(c.host, 0u);
  EXPECT_GT(c.bytes_recovered, 0u);
}

TEST(KernelResolver, NoCopyFailsTheBatchLikeTheReference) {
  PlanScenario sc(5, PlanScenarioParams{});
  const KvLayout& l = *sc.layout;
  const auto& gs = sc.config.groups[0];
  CpuDevice ref_device, kernel_device;
  const PoolId ref_pool = *ref_device.AllocatePool(l.pool_bytes());
  const PoolId kernel_pool = *kernel_device.AllocatePool(l.pool_bytes());
  ReferenceResolver ref(ResolverEnv{&l, &ref_device, ref_pool, std::span<uint8_t>(sc.host_pool), {}});
  HostCompute compute(&kernel_device, sc.host_pool);
  auto kernel = *KernelResolver::Create(
      ResolverEnv{&l, &kernel_device, kernel_pool, std::span<uint8_t>(sc.host_pool), {}}, &compute, HostRunner);
  // Request 1's page 0 has no copy anywhere: its query fails; request 0's query (before it) claimed slots.
  sc.kvs[1].PlaceGpuCopy(0, GpuCopy::kNone, -1);
  sc.kvs[1].PlaceHostCopy(0, HostCopy::kNone, -1);
  auto sel = sc.NextSelections(0);
  if (std::find(sel[1].begin(), sel[1].end(), Position{0}) == sel[1].end()) sel[1][0] = 0;  // distinct
  const size_t k = sc.config.k, ns = gs.size();
  std::vector<std::vector<Location>> ref_out(sel.size(), std::vector<Location>(ns * k, 7)), kernel_out = ref_out;
  std::vector<ResolveQuery> ref_batch, kernel_batch;
  for (size_t i = 0; i < sel.size(); ++i) {
    ref_batch.push_back(ResolveQuery{&sc.kvs[i], sel[i], ref_out[i]});
    kernel_batch.push_back(ResolveQuery{&sc.kvs[i], sel[i], kernel_out[i]});
  }
  ASSERT_EQ(ref.Resolve(0, gs, ref_batch).code(), absl::StatusCode::kInternal);
  ASSERT_EQ(kernel->Resolve(0, gs, kernel_batch).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(kernel->census(0), Census{});
  for (const auto& out : kernel_out) {
    for (Location loc : out) ASSERT_EQ(loc, kNoLocation);
  }
  for (uint32_t slot = 0; slot < sc.config.slots; ++slot) {
    for (uint32_t h = 0; h < sc.config.hot_rows; ++h) {
      ASSERT_EQ(kernel->HotPosition(slot, 0, h), ref.HotPosition(slot, 0, h)) << "slot " << slot << " h " << h;
    }
  }
  // A position beyond the request's rows: INVALID_ARGUMENT before anything runs.
  sel[0][0] = sc.Length(0, 0) + 5;
  kernel_batch[0].selection = sel[0];
  EXPECT_EQ(kernel->Resolve(0, gs, {kernel_batch.data(), 1}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(KernelResolver, CreateRefusesWhatItCannotRunOn) {
  PlanScenario sc(6, PlanScenarioParams{});
  CpuDevice device;
  const PoolId pool = *device.AllocatePool(sc.layout->pool_bytes());
  const ResolverEnv env{sc.layout.get(), &device, pool, std::span<uint8_t>(sc.host_pool), {}};
  std::vector<uint8_t> other(64);
  HostCompute compute(&device, sc.host_pool), unmapped(&device, other);
  EXPECT_EQ(KernelResolver::Create(env, nullptr, HostRunner).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KernelResolver::Create(env, &compute, PlanRunner()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KernelResolver::Create(env, &unmapped, HostRunner).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(KernelResolver::Create(env, &compute, HostRunner).ok());
}

// A CpuDevice with a compute side (as CudaDevice has): every Device call forwarded.
class ComputeDevice final : public Device {
 public:
  explicit ComputeDevice(std::span<uint8_t> host) : compute_(&cpu_, host) {}
  absl::StatusOr<PoolId> AllocatePool(uint64_t bytes) override { return cpu_.AllocatePool(bytes); }
  uint64_t PoolBytes(PoolId pool) const override { return cpu_.PoolBytes(pool); }
  CopyEvent CopyHostToDevice(std::span<const HostToDeviceCopy> ops, std::span<const CopyEvent> after) override {
    return cpu_.CopyHostToDevice(ops, after);
  }
  CopyEvent CopyDeviceToHost(std::span<const DeviceToHostCopy> ops, std::span<const CopyEvent> after) override {
    return cpu_.CopyDeviceToHost(ops, after);
  }
  CopyEvent CopyDeviceToDevice(std::span<const DeviceToDeviceCopy> ops, std::span<const CopyEvent> after) override {
    return cpu_.CopyDeviceToDevice(ops, after);
  }
  ReaderId BeginReaders(std::span<const DeviceRange> ranges) override { return cpu_.BeginReaders(ranges); }
  void EndReaders(ReaderId reader) override { cpu_.EndReaders(reader); }
  bool ReadersBusy(const DeviceRange& range) const override { return cpu_.ReadersBusy(range); }
  CopyEvent ReadersFence(const DeviceRange& range) override { return cpu_.ReadersFence(range); }
  uint8_t* HostVisible(PoolId pool, Location offset) override { return cpu_.HostVisible(pool, offset); }
  DeviceCompute* Compute() override { return &compute_; }

 private:
  CpuDevice cpu_;
  HostCompute compute_;
};

TEST(KernelResolver, HierarchicalKvAccessTakesItWithAComputeSideAndARunner) {
  KvConfig c;
  c.row_bytes = {16};
  c.groups = {{0}};
  c.page_rows = 4;
  c.k = 4;
  c.hot_rows = 8;
  c.tail_rows = 8;
  c.slots = 2;
  const KvLayout layout = *KvLayout::Create(c);
  std::vector<uint8_t> host(16 * layout.host_page_bytes());
  PageIndex next = 0;
  HostPoolAccess access{host, [&]() -> std::optional<PageIndex> { return next < 16 ? std::optional(next++) : std::nullopt; },
                        [](PageIndex) {}};
  CpuDevice cpu;
  ComputeDevice gpu_like(host);
  SetDevicePlanRunner(PlanRunner());
  auto a = *HierarchicalKvAccess::Create(c, &gpu_like, access, ResolverKind::kFused);
  EXPECT_NE(a->fused_resolver(), nullptr) << "no runner set: FusedResolver";
  SetDevicePlanRunner(HostRunner);
  auto b = *HierarchicalKvAccess::Create(c, &cpu, access, ResolverKind::kFused);
  EXPECT_NE(b->fused_resolver(), nullptr) << "the CPU backend has no compute side: FusedResolver";
  auto kv = *HierarchicalKvAccess::Create(c, &gpu_like, access, ResolverKind::kFused);
  ASSERT_EQ(kv->fused_resolver(), nullptr);
  // Rows 0..23 of request 1: pages 0..3 backed up as they complete (rows 0..15 leave the tail), then read back
  // through the kernel resolver: every row's bytes are the ones appended.
  for (Position t = 0; t < 24; ++t) {
    std::vector<uint8_t> row(16, static_cast<uint8_t>(t * 7 + 1));
    ASSERT_TRUE(kv->Append(1, 0, t, row).ok()) << t;
    kv->Poll();
  }
  const std::vector<SourceId> src = {0};
  for (Position first = 0; first < 24; first += 4) {
    std::vector<Position> sel = {first, first + 1, first + 2, first + 3};
    std::vector<const uint8_t*> rows(4);
    KvQuery q;
    q.request = 1;
    q.selection = sel;
    q.rows_out = rows;
    ASSERT_TRUE(kv->Fetch(src, {&q, 1}).ok()) << first;
    for (size_t j = 0; j < 4; ++j) {
      ASSERT_NE(rows[j], nullptr);
      EXPECT_EQ(rows[j][5], static_cast<uint8_t>(sel[j] * 7 + 1)) << "row " << sel[j];
    }
    kv->ReadersDone(src);
  }
  EXPECT_GT(kv->census(0).host, 0u);
  SetDevicePlanRunner(PlanRunner());
}

}  // namespace
}  // namespace dhs
