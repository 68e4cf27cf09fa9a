// tests/libdhs/libdhs_bench.cc: what the C ABI adds per decode step (issue 25, "Measure"): append + resolve for a
// batch of 8 requests at dsv4flash-like shapes (brief §8, the workerd preset: 3 sources of d_KV = 288 bytes, 5
// selections per token (3 Write + 2 Reindex layers), k + window = 20 positions, 5 indexers of 128-byte keys, p = 64,
// B = 80, T = 128), over
//   Direct:  HierarchicalKvAccess on a CpuDevice (Append, StoreIndexKeys, Fetch, ReadersDone), no memd;
//   Port:    the same calls through libdhs's data path (libdhs/kv_port.h: PortKvAccess over KvPort), as workerd's
//            model makes them in hisparse and adaptive mode (the port's checks, no C wrapper, no memd);
//   Api:     the same calls through libdhs (dhs_request_append, dhs_resolve, dhs_readers_done) against a real memd
//            ($MEMD), the requests admitted by memd first;
//   ApiPoll: Api plus one dhs_worker_poll per step, as an engine must.
// DHS_BENCH_BACKEND=cuda (a CUDA build, tools/gpu_check.sh on a GPU): Direct and Port run on a CudaDevice with managed
// pools, the host pool pinned and mapped and the resolver kernel (the device libdhs's CUDA backend opens:
// libdhs/region_device_cuda.cc), and Api on DHS_BACKEND_CUDA; ApiPollDevicePool (CUDA only) is ApiPoll over an engine
// pool of plain device memory (cudaMalloc) instead of managed memory. The "kernel" counter says where resolves ran.
// One step: 8 appends (one position, every source, every indexer's key), 5 resolves of 8 queries each, each followed
// by its readers-done. Selections are the same for both (seeded), 512 rows of history at the start. Prints time per
// step, and for the API runs the prefill's dhs_request_append of 512 positions per request (prefill_append_us);
// asserts nothing about time.
#include <dhs/dhs.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/check.h"
#include "tests/common/test_util.h"
#include "workerd/device/cpu_device.h"
#include "libdhs/kv_port.h"
#include "workerd/kv/hierarchical_kv_access.h"
#ifdef DHS_HAVE_CUDA
#include "workerd/device/cuda_device.h"
#include "workerd/kv/cuda_plan_runner.h"
#include "workerd/kv/kernel_resolver.h"
#endif

namespace {

constexpr uint32_t kS = 3, kRow = 288, kIdx = 5, kKey = 128, kP = 64, kK = 20, kB = 80, kT = 128, kBatch = 8;
constexpr uint32_t kPrompt = 512, kSteps = 2000, kMax = kPrompt + kSteps + 8;
constexpr uint32_t kSelSource[] = {0, 0, 1, 1, 2};  // the 5 selections of a token: Write 0, Reindex 0, Write 1, ...
constexpr uint64_t kHostPageBytes = uint64_t{kP} * (kS * kRow + kIdx * kKey);

// Selections of step `step` (deterministic): per selection and request, kK distinct positions below `history`.
std::vector<int64_t> Selections(uint32_t step, int64_t history) {
  std::mt19937_64 g(step);
  std::vector<int64_t> out(std::size(kSelSource) * kBatch * kK);
  for (size_t q = 0; q < std::size(kSelSource) * kBatch; ++q) {
    for (uint32_t j = 0; j < kK; ++j) {  // the local window (4 newest), then distinct older positions
      int64_t t = history - 1 - j;
      if (j >= 4) {
        do {
          t = static_cast<int64_t>(g() % static_cast<uint64_t>(history - 4));
        } while (std::find(&out[q * kK], &out[q * kK + j], t) != &out[q * kK + j]);
      }
      out[q * kK + j] = t;
    }
  }
  return out;
}

const std::vector<uint8_t>& RowBytes() {
  static const std::vector<uint8_t> rows(size_t{kPrompt} * kS * kRow, 7);
  return rows;
}
const std::vector<float>& Keys() {
  static const std::vector<float> keys(size_t{kIdx} * kPrompt * kKey / 4, 0.5f);
  return keys;
}

bool CudaBench() {
  const char* b = std::getenv("DHS_BENCH_BACKEND");
  return b != nullptr && std::string_view(b) == "cuda";
}

// The device of the Direct and Port runs: a CpuDevice, or with DHS_BENCH_BACKEND=cuda a CudaDevice as libdhs's CUDA
// backend makes it (managed pools, `host` pinned and mapped, the resolver kernel); nullptr when this build has no CUDA.
std::unique_ptr<dhs::Device> BenchDevice(std::span<uint8_t> host) {
  if (!CudaBench()) return std::make_unique<dhs::CpuDevice>();
#ifdef DHS_HAVE_CUDA
  auto cuda = dhs::CudaDevice::Create(dhs::CudaDeviceOptions{0, /*managed_pools=*/true});
  DHS_CHECK_OK(cuda.status());
  DHS_CHECK_OK((*cuda)->RegisterHostPool(host).status());
  dhs::SetDevicePlanRunner(dhs::plan::CudaPlanRunner());
  return *std::move(cuda);
#else
  (void)host;
  return nullptr;
#endif
}

void BM_Direct(benchmark::State& state, bool through_port) {
  std::vector<uint8_t> host(512 * kHostPageBytes);
  const std::unique_ptr<dhs::Device> device = BenchDevice(host);
  if (device == nullptr) return state.SkipWithError("DHS_BENCH_BACKEND=cuda: this build has no CUDA");
  uint32_t next_host = 0;
  dhs::HostPoolAccess pool{host, [&]() -> std::optional<dhs::PageIndex> { return next_host++; }, [](dhs::PageIndex) {}};
  dhs::KvConfig c;
  c.row_bytes.assign(kS, kRow);
  for (dhs::SourceId s = 0; s < kS; ++s) c.groups.push_back({s});
  c.page_rows = kP;
  c.hot_rows = kB;
  c.k = kK;
  c.tail_rows = kT;
  c.slots = kBatch;
  c.optional_pages = 64;
  c.key_bytes.assign(kIdx, kKey);
  auto kv = dhs::HierarchicalKvAccess::Create(c, device.get(), pool, dhs::ResolverKind::kFused);
  DHS_CHECK_OK(kv.status());
  state.counters["kernel"] = (*kv)->resolves_on_device() ? 1 : 0;
  dhs::lib::HierarchicalPortStore store(kv->get());
  dhs::lib::KvPort port(&store);
  dhs::lib::PortKvAccess port_kv(&port);
  dhs::KvAccess* a = through_port ? static_cast<dhs::KvAccess*>(&port_kv) : kv->get();
  const std::vector<uint8_t>& rows = RowBytes();
  const std::vector<float>& keys = Keys();
  for (dhs::RequestId r = 1; r <= kBatch; ++r) {
    for (uint32_t t = 0; t < kPrompt; ++t) {
      for (dhs::SourceId s = 0; s < kS; ++s) {
        DHS_CHECK_OK(a->Append(r, s, t, std::span(rows).subspan(0, kRow)));
      }
    }
    for (uint32_t x = 0; x < kIdx; ++x) {
      DHS_CHECK_OK(a->StoreIndexKeys(r, x, 0, std::span(keys).subspan(0, kPrompt * kKey / 4)));
    }
  }
  int64_t t = kPrompt;
  uint32_t step = 0;
  std::vector<const uint8_t*> out(kBatch * kK);
  for (auto _ : state) {
    state.PauseTiming();
    const std::vector<int64_t> sel = Selections(step++, t + 1);
    state.ResumeTiming();
    for (dhs::RequestId r = 1; r <= kBatch; ++r) {
      for (dhs::SourceId s = 0; s < kS; ++s) DHS_CHECK_OK(a->Append(r, s, t, std::span(rows).subspan(0, kRow)));
      for (uint32_t x = 0; x < kIdx; ++x) {
        DHS_CHECK_OK(a->StoreIndexKeys(r, x, t, std::span(keys).subspan(0, kKey / 4)));
      }
    }
    for (size_t q = 0; q < std::size(kSelSource); ++q) {
      std::vector<dhs::KvQuery> batch(kBatch);
      for (uint32_t r = 0; r < kBatch; ++r) {
        batch[r] = dhs::KvQuery{r + 1, std::span(sel).subspan((q * kBatch + r) * kK, kK),
                                std::span(out).subspan(r * kK, kK)};
      }
      const dhs::SourceId src = kSelSource[q];
      DHS_CHECK_OK(a->Fetch({&src, 1}, batch));
      a->ReadersDone({&src, 1});
    }
    ++t;
    if (t >= kMax - 1) state.SkipWithError("history limit");
  }
  state.counters["requests"] = kBatch;
}

struct ApiNode {
  dhs::testing::ScopedRunDir dir;
  std::unique_ptr<dhs::testing::ChildProcess> memd;
  dhs_worker* w = nullptr;
  std::vector<uint64_t> ids;
  ~ApiNode() {
    for (uint64_t id : ids) dhs_request_complete(w, id);
    if (w != nullptr) dhs_worker_close(w);
    if (memd != nullptr) memd->Terminate();
  }
};

// poll: one dhs_worker_poll per step. device_pool (the CUDA backend only): the engine's pool is plain device memory
// (cudaMalloc), not the library's managed pool.
void BM_Api(benchmark::State& state, bool poll, bool device_pool) {
  const char* memd_bin = std::getenv("MEMD");
  if (memd_bin == nullptr) {
    state.SkipWithError("MEMD is not set");
    return;
  }
  // The engine's device pool (device_pool) outlives the node: the worker closes over it first.
  struct DevicePool {
    void* p = nullptr;
    ~DevicePool() {
#ifdef DHS_HAVE_CUDA
      if (p != nullptr) cudaFree(p);
#endif
    }
  } engine_pool;
  ApiNode node;
  node.memd = std::make_unique<dhs::testing::ChildProcess>(std::vector<std::string>{
      memd_bin, "--run-dir", node.dir.path(), "--page-bytes", std::to_string(kHostPageBytes), "--host-pool-pages",
      "512", "--log-level", "error"});
  for (int i = 0; i < 400 && !std::filesystem::exists(node.dir.path() + "/memd.sock"); ++i) ::poll(nullptr, 0, 25);
  dhs_worker_config c;
  std::memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.abi_version = DHS_ABI_VERSION;
  c.run_dir = node.dir.path().c_str();
  c.mode = DHS_MODE_ADAPTIVE;
  c.backend = CudaBench() ? DHS_BACKEND_CUDA : DHS_BACKEND_CPU;
  c.sources = kS;
  c.row_bytes = kRow;
  c.indexers = kIdx;
  c.index_key_bytes = kKey;
  c.page_rows = kP;
  c.top_k = kK;
  c.hot_rows = kB;
  c.tail_rows = kT;
  c.slots = kBatch;
  c.hbm_budget_bytes = uint64_t{400} * kP * kS * kRow;
  c.connect_timeout_ms = 10000;
  if (device_pool) {
#ifdef DHS_HAVE_CUDA
    if (!CudaBench()) return state.SkipWithError("the CUDA backend's variant (DHS_BENCH_BACKEND=cuda)");
    uint64_t need = 0;
    if (dhs_pool_bytes_needed(&c, &need) != DHS_OK || cudaMalloc(&engine_pool.p, need) != cudaSuccess) {
      return state.SkipWithError("no device memory for the engine's pool");
    }
    c.engine_pool = engine_pool.p;
    c.engine_pool_bytes = need;
#else
    return state.SkipWithError("the CUDA backend's variant: this build has no CUDA");
#endif
  }
  if (dhs_worker_open(&c, &node.w) != DHS_OK) {
    state.SkipWithError(dhs_worker_errmsg(node.w));
    return;
  }
  {
    size_t need = 0;
    dhs_worker_stats_json(node.w, nullptr, 0, &need);
    std::string stats(need, '\0');
    dhs_worker_stats_json(node.w, stats.data(), stats.size(), &need);
    state.counters["kernel"] = stats.find("\"resolver\":\"kernel\"") != std::string::npos ? 1 : 0;
  }
  dhs_request_desc d{};
  d.struct_size = sizeof d;
  d.input_rows = kPrompt;
  d.max_rows = kMax;
  for (uint32_t i = 0; i < kBatch; ++i) {
    uint64_t id = 0;
    if (dhs_request_submit(node.w, &d, &id) != DHS_OK) return state.SkipWithError(dhs_worker_errmsg(node.w));
    node.ids.push_back(id);
  }
  uint32_t granted = 0;
  for (int i = 0; i < 10000 && granted < kBatch; ++i) {
    dhs_event ev[16];
    size_t n = 0;
    if (dhs_worker_poll(node.w, ev, 16, &n) != DHS_OK) return state.SkipWithError(dhs_worker_errmsg(node.w));
    for (size_t e = 0; e < n; ++e) granted += ev[e].kind == DHS_EVENT_GRANTED ? 1 : 0;
    if (n == 0) ::poll(nullptr, 0, 1);
  }
  if (granted < kBatch) return state.SkipWithError("memd did not grant the batch");
  const std::vector<uint8_t>& rows = RowBytes();
  // keys for the prompt laid out [indexer][position][key]: all the same value here
  std::vector<uint8_t> prompt_keys(size_t{kIdx} * kPrompt * kKey, 0);
  std::vector<uint8_t> prompt(size_t{kPrompt} * kS * kRow, 7);
  const auto prefill_start = std::chrono::steady_clock::now();
  for (uint64_t id : node.ids) {  // each request's prompt in one call: kPrompt positions, every source, every key
    if (dhs_request_append(node.w, id, 0, kPrompt, prompt.data(), prompt.size(), prompt_keys.data(),
                           prompt_keys.size()) != DHS_OK) {
      return state.SkipWithError(dhs_worker_errmsg(node.w));
    }
  }
  // The prefill's append, us per request of kPrompt positions (one figure per run: outside the timed steps).
  state.counters["prefill_append_us"] =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - prefill_start).count() / kBatch;
  std::vector<uint8_t> step_keys(size_t{kIdx} * kKey, 0);
  std::vector<int64_t> loc(kBatch * kK);
  int64_t t = kPrompt;
  uint32_t step = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const std::vector<int64_t> sel = Selections(step++, t + 1);
    state.ResumeTiming();
    for (uint64_t id : node.ids) {
      if (dhs_request_append(node.w, id, t, 1, rows.data(), size_t{kS} * kRow, step_keys.data(), step_keys.size()) !=
          DHS_OK) {
        return state.SkipWithError(dhs_worker_errmsg(node.w));
      }
    }
    for (size_t q = 0; q < std::size(kSelSource); ++q) {
      dhs_query qs[kBatch];
      for (uint32_t r = 0; r < kBatch; ++r) {
        qs[r] = dhs_query{node.ids[r], sel.data() + (q * kBatch + r) * kK, kK, 0, loc.data() + r * kK};
      }
      const uint32_t src = kSelSource[q];
      if (dhs_resolve(node.w, &src, 1, qs, kBatch) != DHS_OK) return state.SkipWithError(dhs_worker_errmsg(node.w));
      dhs_readers_done(node.w, &src, 1);
    }
    if (poll) {
      dhs_event ev[16];
      size_t n = 0;
      if (dhs_worker_poll(node.w, ev, 16, &n) != DHS_OK) return state.SkipWithError(dhs_worker_errmsg(node.w));
    }
    ++t;
    if (t >= kMax - 1) state.SkipWithError("history limit");
  }
  state.counters["requests"] = kBatch;
}

void BM_ApiNoPoll(benchmark::State& state) { BM_Api(state, false, false); }
void BM_ApiPoll(benchmark::State& state) { BM_Api(state, true, false); }
void BM_ApiPollDevicePool(benchmark::State& state) { BM_Api(state, true, true); }

BENCHMARK_CAPTURE(BM_Direct, Direct, false)->Iterations(kSteps)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Direct, Port, true)->Iterations(kSteps)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ApiNoPoll)->Iterations(kSteps)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ApiPoll)->Iterations(kSteps)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ApiPollDevicePool)->Iterations(kSteps)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
